"""One small evaluation with the real Inspect AI and its built-in mockllm model (no network), for
the live integration's tests and the importer's: 4 samples x 2 epochs of "2 + 2", the model always
answering "4"."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any


def run_arith_eval(
    log_dir: Path,
    fails: dict[tuple[int, int], int],
    *,
    retries: int,
    target_of: dict[int, str],
    fail_on_error: bool | None = None,
) -> Any:
    """The eval's log. ``fails[(sample, epoch)]``: how many attempts of that sample x epoch raise
    first; ``target_of[sample]``: a target other than "4" (the model then gets it wrong);
    ``retries``: Inspect's ``retry_on_error``; ``fail_on_error``: Inspect's, when given."""
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.dataset import Sample
    from inspect_ai.model import ModelOutput, ModelUsage, get_model
    from inspect_ai.scorer import match
    from inspect_ai.solver import Generate, Solver, TaskState, generate, solver

    def answers() -> Iterator[ModelOutput]:
        # Usage given with each output: mockllm would otherwise count tokens with tiktoken, which
        # downloads its encodings.
        while True:
            output = ModelOutput.from_content(model="model", content="4")
            output.usage = ModelUsage(input_tokens=11, output_tokens=1, total_tokens=12)
            yield output

    @solver
    def flaky() -> Solver:
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            key = (int(state.sample_id), state.epoch)
            if fails.get(key, 0) > 0:
                fails[key] -= 1
                raise RuntimeError("sandbox lost")
            return state

        return solve

    task = Task(
        dataset=[
            Sample(id=i, input=f"What is 2 + 2? ({i})", target=target_of.get(i, "4")) for i in range(1, 5)
        ],
        solver=[flaky(), generate()],
        scorer=match(),
        name="arith",
    )
    options: dict[str, Any] = {} if fail_on_error is None else {"fail_on_error": fail_on_error}
    (log,) = inspect_eval(
        task,
        model=get_model("mockllm/model", custom_outputs=answers()),
        epochs=2,
        retry_on_error=retries,
        display="none",
        log_dir=str(log_dir),
        **options,
    )
    return log
