"""``tierq examples [DIR]``: the example evaluation run, out of the installed package, so
that a wheel alone is enough to try it (``examples/README.md``)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from jobs.cli.common import fail, friendly
from jobs.process.program import tierq_command

FILES = ("sts-mini.jsonl", "correlation.py", "README.md")


@friendly
def examples(
    directory: Annotated[Path, typer.Argument(help="Where to write them.")] = Path(
        "tierq-examples"),
) -> None:
    """Write the example evaluation run (a labelled set of sentence pairs and the script
    that scores the results) into DIR, and print how to run it."""
    source = resources.files("jobs.examples")
    directory.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        target = directory / name
        if target.exists():
            fail(f"{target} exists already: choose another directory", 2)
        target.write_bytes((source / name).read_bytes())
    tierq = tierq_command()
    python = Path(tierq).parent / "python" if "/" in tierq else Path("python")
    data, script = directory / FILES[0], directory / FILES[1]
    console = Console(highlight=False, soft_wrap=True)
    console.print(f"wrote {', '.join(str(directory / name) for name in FILES)}")
    console.print("With tierq up (and the models extra) running and TIERQ_API_KEY set:")
    console.print(f"  {tierq} batch submit {data} --kind eval.similarity --wait", markup=False)
    console.print(f"  {tierq} batch results <the batch id it printed> > results.jsonl",
                  markup=False)
    console.print(f"  {python} {script} {data} results.jsonl", markup=False)
