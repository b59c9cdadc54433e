"""Each tolerance rule of :mod:`repro.verdicts` at its edge: the value on the edge agrees, a hair beyond differs, and
a null on the edge counts as agreeing too. The edges are worked out by hand from the paper's numbers (T3's
``e2e_train_max`` = 12, ``comm_frac_train`` = 34, ``nonsliced_attn_share`` = 40-45); the tolerance-relative case
beside it is test_null_models.py's."""

from __future__ import annotations

import pytest

from repro import verdicts as V
from repro.vocabulary import Null

FAR = Null("far", 0.0)


@pytest.mark.parametrize("rel, abs_, edge", [
    (0.5, 3.0, 6.0),  # the larger of 0.5 x 12 = 6 and 3 is the tolerance
    (0.1, 3.0, 3.0),  # the larger of 0.1 x 12 = 1.2 and 3
    (0.25, None, 3.0),  # 0.25 x 12 alone
    (None, 2.0, 2.0),  # 2 alone
])
def test_check_value_allows_the_larger_of_rel_times_the_paper_and_abs(rel, abs_, edge):
    check = lambda value, null=FAR: V.check_value("t3_2024", "e2e_train_max", value, evidence="simulated",  # noqa: E731
                                                  rel=rel, abs=abs_, null=null)
    for value in (12 + edge, 12 - edge):
        assert check(value).verdict == "reproduced", value
        assert check(value, Null("edge", value)).verdict == "agrees, not decisive", value
    for value in (12 + edge + 0.01, 12 - edge - 0.01):
        assert check(value).verdict == "differs", value
        assert check(12.0, Null("beyond", value)).verdict == "reproduced", value


def test_a_relative_tolerance_is_the_papers_also_below_it():
    # comm_frac_train 34 +-10 %: 3.4 either side. Relative to the measured value the band would shift: 30.6 * 0.1 =
    # 3.06 < 3.4 (30.6 would differ), and 37.4 * 0.1 = 3.74 (37.5 would agree)
    check = lambda v: V.check_value("t3_2024", "comm_frac_train", v, evidence="simulated", rel=0.10,  # noqa: E731
                                    null=FAR).verdict
    assert [check(v) for v in (30.6, 30.59, 37.4, 37.41)] == ["reproduced", "differs", "reproduced", "differs"]


@pytest.mark.parametrize("abs_", [0.0, 1.0])
def test_check_range_includes_both_ends_widened_by_abs(abs_):
    low, high = 40.0 - abs_, 45.0 + abs_
    check = lambda value, null=FAR: V.check_range("t3_2024", "nonsliced_attn_share", value,  # noqa: E731
                                                  evidence="predicted", abs=abs_, null=null).verdict
    assert check(low) == check(high) == "reproduced"
    assert check(low - 0.01) == check(high + 0.01) == "differs"
    assert check(42.0, Null("edge", low)) == check(42.0, Null("edge", high)) == "agrees, not decisive"
    assert check(42.0, Null("beyond", low - 0.01)) == check(42.0, Null("beyond", high + 0.01)) == "reproduced"
