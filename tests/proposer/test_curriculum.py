"""The hop curriculum's state arithmetic on hand-made accuracies (proposer/curriculum.py)."""
import pytest

from proposer.curriculum import CurriculumRule, CurriculumState, next_state

RULE = CurriculumRule(window=3, up=0.6, down=0.2, max_level=3)


def play(state, accuracies, rule=RULE):
    """Steps played at the state's level, one accuracy each (None: no task of that length); the levels seen."""
    levels = []
    for accuracy in accuracies:
        state = next_state(state, {state.level: accuracy}, rule)
        levels.append(state.level)
    return state, levels


def test_moves_up_once_a_full_window_passes_the_threshold():
    state, levels = play(CurriculumState(), [0.9, 0.9, 0.5, 0.7, 0.7])
    # window (0.9, 0.9) is not full; (0.9, 0.9, 0.5) -> 0.767 >= 0.6: up; level 2 starts an empty window
    assert levels == [1, 1, 2, 2, 2] and state.window(2) == (0.7, 0.7)
    assert state.window(1) == (0.9, 0.9, 0.5) and state.accuracy(1) == pytest.approx(0.7667, abs=1e-4)


def test_moves_down_when_the_level_collapses_and_never_below_1():
    state, levels = play(CurriculumState(level=2), [0.1, 0.3, 0.1, 0.0, 0.0, 0.0])
    assert levels == [2, 2, 1, 1, 1, 1]  # mean 0.167 <= 0.2: down; at level 1 a collapse stays there
    assert state.level == 1 and state.window(1) == (0.0, 0.0, 0.0)


def test_stays_between_the_thresholds_and_at_the_top_level():
    _, levels = play(CurriculumState(), [0.4] * 6)
    assert levels == [1] * 6
    top, levels = play(CurriculumState(level=3), [1.0] * 4)
    assert levels == [3] * 4 and top.level == RULE.max_level


def test_the_window_keeps_the_last_n_steps():
    state, levels = play(CurriculumState(), [0.0, 0.0, 0.5, 0.5, 1.0])
    # (0, 0, .5) and (0, .5, .5) stay; (.5, .5, 1.0) -> 0.667 moves up
    assert levels == [1, 1, 1, 1, 2] and state.window(1) == (0.5, 0.5, 1.0)


def test_a_step_without_tasks_at_the_level_adds_nothing():
    state, levels = play(CurriculumState(), [0.9, None, None, 0.9, 0.9])
    assert levels == [1, 1, 1, 1, 2]
    assert next_state(CurriculumState(), {}, RULE) == CurriculumState()


def test_entering_a_level_clears_its_stale_window():
    # Up to 2 on good level-1 steps, down again on a collapse at 2: level 1's old window (that moved the
    # run up) is gone, so one more good step does not send it straight back up.
    state, _ = play(CurriculumState(), [0.9, 0.9, 0.9])
    state, _ = play(state, [0.0, 0.0, 0.0])
    assert state.level == 1 and state.window(1) == () and state.window(2) == (0.0, 0.0, 0.0)
    state, levels = play(state, [0.9, 0.9, 0.9])
    assert levels == [1, 1, 2]


def test_other_levels_accuracies_go_to_their_own_windows():
    state = next_state(CurriculumState(), {1: 0.5, 3: 0.25}, RULE)
    assert state.window(1) == (0.5,) and state.window(3) == (0.25,) and state.accuracy(2) is None


def test_record_round_trip_and_bounds():
    state, _ = play(CurriculumState(), [0.9, 0.9, 0.9, 0.5])
    record = state.to_record()
    assert record == {"level": 2, "windows": {"1": [0.9, 0.9, 0.9], "2": [0.5]}}
    assert CurriculumState.from_record(record, RULE) == state
    # a smaller max level or window (never from a resume: the experiment check forbids it) is respected
    smaller = CurriculumState.from_record(record, CurriculumRule(window=2, up=0.6, down=0.2, max_level=1))
    assert smaller.level == 1 and smaller.window(1) == (0.9, 0.9)
    with pytest.raises(ValueError, match="not a curriculum state"):
        CurriculumState.from_record({"level": "two"}, RULE)


def test_the_state_is_frozen_and_next_state_leaves_it_alone():
    state = CurriculumState()
    after = next_state(state, {1: 1.0}, RULE)
    assert state == CurriculumState() and after.window(1) == (1.0,)
    with pytest.raises(AttributeError):
        state.level = 2
