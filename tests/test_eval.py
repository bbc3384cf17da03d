from __future__ import annotations

import io

from rollcap._eval import Progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_in_logs_prints_a_line_every_tenth() -> None:
    stream = io.StringIO()
    progress = Progress(stream)
    for done in range(101):
        progress(done, 0, 100)
    progress.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 11
    assert lines[-1].startswith("100/100 rollouts, 0 failed")


def test_progress_on_a_terminal_draws_a_bar_with_rate_and_eta() -> None:
    stream = _Terminal()
    progress = Progress(stream)
    for done in range(0, 51, 10):
        progress(done, 1, 50)
    progress.close()
    out = stream.getvalue()
    assert "50/50" in out
    assert "1 failed" in out
    assert "ETA" in out
