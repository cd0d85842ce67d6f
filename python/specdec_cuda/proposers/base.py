"""The proposer's side of the loop: ``Proposer`` and what it exchanges with the loop.

The contract lives in ``specdec_cuda.contract`` (a leaf module the loop and the proposers both
import); these names are re-exported here, where a method's author looks for them.
"""

from __future__ import annotations

from ..contract import Draft, DraftKind, ExtraRows, Outcome, PrefillContext, Proposer, SamplingParams, StepState

__all__ = ["Draft", "DraftKind", "ExtraRows", "Outcome", "PrefillContext", "Proposer", "SamplingParams",
           "StepState"]
