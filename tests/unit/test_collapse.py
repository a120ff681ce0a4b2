"""The collapse figures (clawrl/guard/collapse.py): ROUGE-L, self-ROUGE-L, entropy ratio, drift, limits."""

from __future__ import annotations

import pytest

from clawrl.guard.collapse import Limits, drift, entropy_ratio, hold, judge, lcs_length, rouge_l, self_rouge_l


def test_rouge_l_is_the_f_measure_of_the_longest_common_subsequence_of_words():
    assert lcs_length(["the", "cat", "sat", "on", "the", "mat"], ["the", "cat", "on", "the", "mat"]) == 5
    # P = 5/5, R = 5/6: F = 2 * 1 * 5/6 / (1 + 5/6) = 10/11
    assert rouge_l("The cat sat on the mat", "the cat on the mat") == pytest.approx(10 / 11)
    # LCS "b d": P = 2/3, R = 2/4, F = 4/7
    assert rouge_l("a b c d", "b d e") == pytest.approx(4 / 7)
    assert rouge_l("b d e", "a b c d") == pytest.approx(4 / 7)  # symmetric
    assert rouge_l("Paris is in France", "paris IS in france") == 1.0
    assert rouge_l("one two", "three four") == 0.0


def test_two_empty_answers_are_alike_and_an_empty_one_shares_nothing_with_words():
    assert rouge_l("", "  ") == 1.0
    assert rouge_l("", "an answer") == 0.0


def test_self_rouge_l_is_the_mean_over_pairs_of_answers_to_different_prompts():
    # pairs: (a b, a b) 1.0, (a b, c d) 0.0, (a b, c d) 0.0
    assert self_rouge_l(["a b", "a b", "c d"]) == pytest.approx(1 / 3)
    assert self_rouge_l(["same words"] * 4) == 1.0
    assert self_rouge_l(["only one"]) is None and self_rouge_l([]) is None


def test_entropy_ratio_and_drift():
    assert entropy_ratio(0.5, 2.0) == 0.25
    assert entropy_ratio(None, 2.0) is None and entropy_ratio(0.5, 0.0) is None
    assert drift([-1.0, -3.0], [-1.5, -1.0]) == pytest.approx((0.5 + 2.0) / 2)
    assert drift([], []) is None
    with pytest.raises(ValueError, match="1 probe logprobs for 2"):
        drift([-1.0], [-1.0, -2.0])


def test_the_verdict_names_each_crossed_limit_and_why():
    healthy = judge(1.8, 2.0, 0.3, 0.25, 0.4, Limits())
    assert healthy.crossed == () and healthy.reasons == () and healthy.entropy_ratio == pytest.approx(0.9)
    collapsed = judge(0.5, 2.0, 0.9, 0.25, 2.5, Limits())
    assert collapsed.crossed == ("entropy", "self_rouge_l", "drift")
    assert collapsed.reasons == (
        "answer entropy 0.500 is 0.25 of the base's 2.000 (min 0.6)",
        "self-ROUGE-L 0.900 between answers > 0.85",
        "logprob drift 2.500 nats/token on the probes > 2",
    )
    assert collapsed.figures()["crossed"] == ["entropy", "self_rouge_l", "drift"]
    assert judge(1.2, 2.0, 0.85, None, 2.0, Limits()).crossed == ()  # at a limit is not past it
    assert judge(None, None, None, None, None, Limits()).crossed == ()
    # answers no more alike than the base's own are not growing alike
    assert judge(1.8, 2.0, 0.95, 0.95, 0.1, Limits()).crossed == ()
    assert judge(1.8, 2.0, 0.96, 0.95, 0.1, Limits()).crossed == ("self_rouge_l",)


def test_a_policy_spreading_past_the_limit_is_marked_as_such():
    # issue 53's runs: batches of only negative rewards served versions at 1.35-1.39x v0's entropy
    assert judge(2.7, 2.0, 0.3, 0.25, 0.4, Limits()).crossed == ()
    assert judge(3.0, 2.0, 0.3, 0.25, 0.4, Limits()).crossed == ()  # at the limit is not past it
    spread = judge(3.2, 2.0, 0.3, 0.25, 0.4, Limits())
    assert spread.crossed == ("spread",)
    assert spread.reasons == (
        "answer entropy 3.200 is 1.60 of the base's 2.000 (max 1.5): the policy spreads",
    )
    assert judge(3.2, 2.0, 0.3, 0.25, 0.4, Limits(max_entropy_ratio=2.0)).crossed == ()


def test_a_crossed_limit_holds_only_when_hold_on_collapse_and_keeps_the_canarys_reason():
    found = judge(1.8, 2.0, 0.3, 0.25, 2.5, Limits())
    assert hold("passed", None, found, hold_on_collapse=False) == ("passed", None)
    assert hold("passed", None, found, hold_on_collapse=True) == (
        "held",
        "collapse: logprob drift 2.500 nats/token on the probes > 2",
    )
    assert hold("held", "KL too high", found, True) == (
        "held",
        "KL too high; collapse: logprob drift 2.500 nats/token on the probes > 2",
    )
    assert hold("passed", None, judge(1.8, 2.0, 0.3, 0.25, 0.1, Limits()), True) == ("passed", None)


def test_the_versions_line_and_trainer_log_name_the_crossed_collapse_limits():
    from clawrl.types import canary_figures

    figures = {"score": 0.41, "drop": 0.01, "kl": 0.0123, "collapse": {"crossed": []}}
    assert canary_figures(figures) == "canary 0.4100 (-1.0%), KL 0.0123"
    figures["collapse"]["crossed"] = ["entropy", "drift"]
    assert canary_figures(figures) == "canary 0.4100 (-1.0%), KL 0.0123, collapse: entropy, drift"


def test_clawrl_canary_describes_the_collapse_figures_in_one_phrase():
    from clawrl.guard.collapse import describe

    found = judge(0.5, 2.0, 0.3, 0.25, 0.1234, Limits())
    assert describe(found.figures()) == (
        "answer entropy 0.25 of the base's, self-ROUGE-L 0.30 (base 0.25), drift 0.123 nats: COLLAPSE entropy"
    )
    assert describe({}) == "answer entropy - of the base's, self-ROUGE-L - (base -), drift - nats"
