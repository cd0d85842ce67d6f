"""Training prompts for the real pair's drafters, from Python's standard library (not HumanEval).

Every function of the stdlib with a docstring becomes a HumanEval-shaped problem: its signature
and docstring, with the body left out, sent as the bench's chat request (``humaneval.INSTRUCTION``
and the code block), so the target's continuations look like what it answers in the bench. The
drafters are trained on the target's own answers (``python -m specdec_cuda.train``), never on
HumanEval's problems or solutions.

    python bench/stdlib_prompts.py --out bench/results/stdlib-prompts.jsonl [--count 768] [--seed 0]
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import sys
import sysconfig
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import humaneval  # noqa: E402

MAX_DOC_LINES = 12  # longer docstrings are cut: HumanEval's run to about that


def stub(source: str, node: ast.FunctionDef) -> str | None:
    """The function's signature and docstring as source (the body dropped), or None."""
    doc = ast.get_docstring(node, clean=True)
    if not doc or node.name.startswith("_") or len(doc) < 40:
        return None
    lines = source.splitlines()
    start = node.lineno - 1  # the def line (decorators, above it, are left out)
    header_end = node.body[0].lineno - 1  # the docstring's first line
    header = "\n".join(line[node.col_offset:] for line in lines[start:header_end])
    if "def " not in header or len(header) > 400:
        return None
    body_indent = " " * 4
    doc_lines = doc.splitlines()[:MAX_DOC_LINES]
    quoted = "\n".join(body_indent + line if line else "" for line in doc_lines)
    return f'{header}\n{body_indent}"""\n{quoted}\n{body_indent}"""\n'


def stdlib_stubs(root: Path) -> list[str]:
    """Every public, documented top-level function or method of the stdlib's ``.py`` files (tests,
    idlelib, lib2to3 and site-packages left out), in file order."""
    skip = ("test", "idlelib", "lib2to3", "site-packages", "tkinter", "turtledemo", "ensurepip")
    out = []
    for path in sorted(root.rglob("*.py")):
        if any(part in skip or part.startswith("test") for part in path.relative_to(root).parts):
            continue
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                text = stub(source, node)
                if text is not None:
                    out.append(text)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--count", type=int, default=768, help="prompts (a random sample of the stubs)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    stubs = stdlib_stubs(Path(sysconfig.get_paths()["stdlib"]))
    random.Random(args.seed).shuffle(stubs)
    chosen = stubs[: args.count]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for text in chosen:
            f.write(json.dumps({"messages": humaneval.chat_messages({"prompt": text})}) + "\n")
    print(f"{len(chosen)} prompts (of {len(stubs)} documented stdlib functions) -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
