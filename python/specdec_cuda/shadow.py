"""Shadow drafts: what a free proposer would have drafted on the steps the policy decodes plainly,
scored against the tokens those steps commit.

The speculation policy learns a row's acceptance only from the drafts it pays to verify, so once
it has chosen plain decoding it learns nothing more until a probe. For a proposer whose drafts
cost no forward (prompt lookup: an n-gram index lookup), that is a waste: the chain it would have
drafted can be compared with what the plain steps then emit, for free. Acceptance at T = 0 is
"the draft token equals the target's argmax", and with sample-and-match at T > 0 "equals the
target's sample", which is the token a plain step commits either way. So a shadow chain ``d_1 ..
d_k`` started on a plain step, matched against the next emitted tokens, accepts exactly what it
would have accepted had it been verified: the longest prefix of it that the text repeats. The
policy counts it as a draft of the row (``CostAwarePolicy.observe_shadow``): a row entering a
passage it copies (a function signature restated, a loop body repeated) shows it within one
shadow chain, and drafting resumes without waiting for a probe.

One shadow chain per row at a time (a new one starts once the last is resolved), so every
emitted token is judged once, as a row drafting without pause would judge it.
"""

from __future__ import annotations


class ShadowDrafts:
    """Per row: the pending shadow chain, where in the row's output its guesses begin, and how many
    of them have been judged.

    ``chains[b]``: the tokens row ``b``'s proposer would have drafted, or None (no pending chain);
    ``starts[b]``: the index into the row's emitted tokens (``RowOutputs.out[b]``) of the token the
    chain's first guess is compared with; ``judged[b]``: guesses compared so far (all matched).
    """

    def __init__(self, batch: int) -> None:
        self.chains: list[list[int] | None] = [None] * batch
        self.starts = [0] * batch
        self.judged = [0] * batch

    def wanted(self, active: list[bool], limits: list[int], budget: list[int], max_draft: int) -> list[int]:
        """The chain depth to ask the proposer for, per row: rows running a plain step (granted no
        drafts) with no pending chain, as deep as a draft could be (``max_draft``, less the bonus
        token of the row's budget); 0 elsewhere. A row granted drafts drops its pending chain: its
        verified draft measures the same tokens."""
        depth = [0] * len(active)
        for b, (a, lim, left) in enumerate(zip(active, limits, budget)):
            if not a:
                continue
            if lim > 0:
                self.chains[b] = None
            elif self.chains[b] is None:
                depth[b] = max(0, min(max_draft, left - 1))
        return depth

    def start(self, chains: list[list[int]], emitted: list[int]) -> None:
        """Pending chains for the rows given one (an empty list: no match, no chain);
        ``emitted[b]``: how many tokens row ``b`` has emitted so far."""
        for b, chain in enumerate(chains):
            if chain:
                self.chains[b], self.starts[b], self.judged[b] = list(chain), emitted[b], 0

    def pending(self) -> bool:
        return any(c is not None for c in self.chains)

    def judge(self, out: list[list[int]], done: list[bool]) -> list[tuple[int, int, bool, bool]]:
        """Compare the pending chains' next guesses with the rows' newly emitted tokens ``out``;
        returns ``(row, matched, missed, first)`` per row with news: ``matched`` guesses the text
        repeated since the last call, ``missed`` whether the next one it did not (the chain is then
        over, as it is once every guess matched), ``first`` whether these are the chain's first
        judged guesses. Reported as they come, so that a row that starts copying is seen to after
        one plain step, not after a whole chain's. A row that finished first (EOS, its budget)
        drops its chain."""
        news = []
        for b, chain in enumerate(self.chains):
            if chain is None:
                continue
            seen = self.judged[b]
            got = out[b][self.starts[b] + seen: self.starts[b] + len(chain)]
            n = 0
            while n < len(got) and got[n] == chain[seen + n]:
                n += 1
            missed = n < len(got)
            if n or missed:
                news.append((b, n, missed, seen == 0))
            self.judged[b] = seen + n
            if missed or self.judged[b] == len(chain) or done[b]:
                self.chains[b] = None
        return news
