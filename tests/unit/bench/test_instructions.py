"""bench/instructions.py: the counts' arithmetic, the table, and each case's driver deciding as
intended (the answers it checks), without valgrind."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import instructions
from bench.workload import key_values

ROOT = Path(__file__).resolve().parents[3]


def test_totals_read_from_a_callgrind_file() -> None:
    text = "events: Ir\nsummary: 2161124173\nfl=x\n"
    assert instructions.totals(text) == 2_161_124_173
    with pytest.raises(ValueError):
        instructions.totals("events: Ir\n")


def test_table_rows_give_each_tree_and_its_ratio_to_the_first() -> None:
    counts = {("before", "hot"): 1000.0, ("after", "hot"): 1100.0, ("after", "penalised"): 5.0}
    rows = instructions.rows(counts, ["before", "after"], ["hot", "penalised"])
    assert rows == [["hot", "1,000", "1,100", "1.100"], ["penalised", "-", "5", "-"]]
    text = instructions.render(counts, ["before", "after"], ["hot"])
    assert (
        text.splitlines()[0]
        == "| case | before instr/decision | after instr/decision | after/before |"
    )


def test_overrides_hold_the_hot_keys_and_every_other_distinct_value() -> None:
    values = instructions.overridden_values()
    loaded = set(values)
    assert len(values) == len(loaded) == instructions.LOADED
    assert set(key_values(instructions.HOT_KEYS)) <= loaded
    distinct = key_values(100_000)[: instructions.DECISIONS]
    met = sum(v in loaded for v in distinct[instructions.HOT_KEYS :])
    assert met == (instructions.DECISIONS - instructions.HOT_KEYS) // 2


CASES = instructions.BASE_CASES + instructions.LOADED_CASES + instructions.FLEET_CASES


@pytest.mark.parametrize("case", CASES)
def test_each_case_answers_as_intended(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the driver checks that the package comes from the tree it runs in
    instructions.drive(case, 50)  # raises SystemExit on an unexpected last answer
