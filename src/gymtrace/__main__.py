from gymtrace._cli import main

raise SystemExit(main())
