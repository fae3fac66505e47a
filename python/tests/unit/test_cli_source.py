"""Source-only CLI behaviour that needs no Manager."""

from __future__ import annotations

import pytest

from orbitkv import cli


def test_usage_and_unknown_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "commands:" in capsys.readouterr().out
    assert cli.main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err
    assert cli.main(["--version"]) == 0


def test_demo_rejects_nonsense_arguments() -> None:
    from orbitkv.demo import main

    with pytest.raises(SystemExit) as e:
        main(["--clients", "0"])
    assert e.value.code == 2
