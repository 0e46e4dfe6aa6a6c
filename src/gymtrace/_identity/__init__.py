"""Identity: which incoming identity is trusted, where identity may go, the identity processor."""
