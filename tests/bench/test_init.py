from bench import split_overrides


def test_split_overrides_cuts_at_the_first_double_dash():
    assert split_overrides(["--steps", "2", "--", "seed=1", "--", "x=2"]) == (["--steps", "2"], ["seed=1", "--", "x=2"])
    assert split_overrides(["--steps", "2"]) == (["--steps", "2"], [])
    assert split_overrides(["--"]) == ([], [])
