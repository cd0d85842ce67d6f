"""The kernels' Philox (csrc/kernels/common/philox.h) equals the reference bit for bit."""

import pytest
import torch

from specdec_cuda import _native
from specdec_cuda.reference import philox

pytestmark = pytest.mark.kernels  # the compiled ops against their references (make cpu-only-check)


# Known-answer vectors of Philox4x32-10 published with Random123 (Salmon et al., SC'11).
KNOWN_ANSWERS = [
    ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    ([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0],
     [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]),
]


def test_known_answers_native_and_reference():
    for counter, key, expected in KNOWN_ANSWERS:
        assert list(_native._C.philox4x32_10(counter, key)) == expected
        ref = philox.philox4x32_10([torch.tensor(c) for c in counter], [torch.tensor(k) for k in key])
        assert [int(x) for x in ref] == expected


def test_streams_match_reference():
    for seed, position, purpose, substream in [
        (0, 0, 1, 0), (1234567890123, 77, 3, 0), (2**64 - 1, 2**40 + 5, 2, 9), (42, 3, 4, 2**23 + 1),
    ]:
        native = _native._C.random_bits(seed, position, purpose, substream, 5, 37)
        seed_t = torch.tensor(seed - 2**64 if seed >= 2**63 else seed, dtype=torch.int64)
        ref = philox.random_bits(seed_t, position, purpose, substream, torch.arange(5, 42))
        assert list(native) == ref.tolist()


def test_uniform_open_interval_and_distinct_purposes():
    bits = philox.random_bits(7, 11, philox.Purpose.ACCEPT, 0, torch.arange(4096))
    u = philox.uniform_open01(bits)
    assert (u > 0).all() and (u < 1).all()
    assert abs(float(u.mean()) - 0.5) < 0.02
    extremes = philox.uniform_open01(torch.tensor([0, 0xFFFFFFFF]))
    assert extremes[0] == 2.0**-24 and extremes[1] == 1 - 2.0**-24
    other = philox.random_bits(7, 11, philox.Purpose.SAMPLE, 0, torch.arange(4096))
    assert not torch.equal(bits, other)
