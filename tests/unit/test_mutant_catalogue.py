"""tests/mutants.py stays runnable as the code moves: every mutant's text occurs exactly once in its file and
every test file it names exists (tests/MUTATION.md records what each mutant's run showed)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _catalogue() -> list:
    spec = importlib.util.spec_from_file_location("sparkd_tests_mutants", REPO / "tests" / "mutants.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return list(module.MUTANTS)


MUTANTS = _catalogue()


@pytest.mark.parametrize("mutant", MUTANTS, ids=[mu.id for mu in MUTANTS])
def test_the_mutant_still_applies_to_the_code_and_names_real_tests(mutant) -> None:  # type: ignore[no-untyped-def]
    assert (REPO / mutant.path).read_text().count(mutant.old) == 1, f"{mutant.id}: edit tests/mutants.py"
    for arg in mutant.tests:
        if not arg.startswith("-"):
            assert (REPO / arg.split("::")[0]).is_file(), f"{mutant.id}: {arg} does not exist"


def test_the_catalogue_and_its_record_list_the_same_mutants() -> None:
    record = (REPO / "tests" / "MUTATION.md").read_text()
    missing = [mu.id for mu in MUTANTS if f"| {mu.id} |" not in record and f"{mu.id} sparkd/" not in record]
    assert not missing, f"tests/MUTATION.md has no row for {missing}"
