"""The room's progress: every exercise verdict recorded per learner (opt-in), and `labkit room`."""

from __future__ import annotations

import json
import stat
import threading
from pathlib import Path

import pytest

from labkit.cli import main as labkit_main
from labkit.cli import room
from labkit.core import progress
from labkit.core.feedback import Feedback, check_integer


@pytest.fixture
def recording(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Recording on, into a temporary learner's folder, as the room's hub sets it."""
    path = tmp_path / "alice" / progress.WORK_DIR / progress.FILE_NAME
    path.parent.mkdir(parents=True)
    monkeypatch.setenv(progress.ENV_VAR, str(path))
    return path


def test_nothing_is_written_unless_the_environment_asks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(progress.ENV_VAR, raising=False)
    monkeypatch.chdir(tmp_path)
    check_integer("00.2", 3, 3, "right", "hint")
    assert progress.progress_path() is None
    assert list(tmp_path.rglob("*")) == []


def test_every_checker_verdict_is_recorded(recording: Path) -> None:
    check_integer("00.2", ..., 3, "right", "hint")  # unanswered: to do
    check_integer("00.2", 4, 3, "right", "hint")  # wrong
    Feedback("05.2", False, True, "a lesson's own verdict")  # made outside the helpers
    check_integer("00.2", 3, 3, "right", "hint")  # right
    check_integer("00.2", None, 3, "right", "hint")  # re-run unanswered: keeps the answer
    data = json.loads(recording.read_text())
    assert data["exercises"]["00.2"]["status"] == "passed"
    assert data["exercises"]["00.2"]["attempts"] == 2
    assert data["exercises"]["05.2"]["status"] == "not yet"
    assert data["learner"]
    assert stat.S_IMODE(recording.stat().st_mode) == 0o600


def test_merge_rules() -> None:
    rec = progress.merge({}, "01.1", "to do", "t0")
    assert rec["exercises"]["01.1"] == {"status": "to do", "attempts": 0, "time": "t0"}
    rec = progress.merge(rec, "01.1", "not yet", "t1")
    rec = progress.merge(rec, "01.1", "passed", "t2")
    assert progress.merge(rec, "01.1", "to do", "t3") is rec
    assert rec["exercises"]["01.1"] == {"status": "passed", "attempts": 2, "time": "t2"}


def test_concurrent_kernels_lose_no_verdict(recording: Path) -> None:
    names = [f"0{i}.{j}" for i in range(4) for j in range(1, 6)]
    threads = [threading.Thread(target=progress.record, args=(n, True, True)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(json.loads(recording.read_text())["exercises"]) == sorted(names)


def test_an_unwritable_place_warns_and_the_lesson_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    not_a_folder = tmp_path / "a-file"
    not_a_folder.write_text("")  # even root cannot create a file inside a file
    monkeypatch.setenv(progress.ENV_VAR, str(not_a_folder / progress.FILE_NAME))
    with pytest.warns(UserWarning, match="not recorded"):
        verdict = check_integer("00.2", 3, 3, "right", "hint")
    assert verdict.passed


def test_room_table_of_learners_and_exercises(tmp_path: Path) -> None:
    verdicts_of = {"bob": [("00.2", True), ("02b.1", False)], "al": [("00.10", True)]}
    for name, verdicts in verdicts_of.items():
        path = tmp_path / name / progress.WORK_DIR / progress.FILE_NAME
        path.parent.mkdir(parents=True)
        for exercise, passed in verdicts:
            progress.record(exercise, passed, True, path)
    rows = room.find_files([tmp_path])
    assert [name for name, _ in rows] == ["al", "bob"]
    table = room.table([(n, {**progress.load(p), "learner": n}) for n, p in rows])
    lines = table.splitlines()
    assert lines[0] == "| learner | 00.2 | 00.10 | 02b.1 | passed |"  # natural order
    assert lines[2] == "| al |  | ✓ |  | 1/3 |"
    assert lines[3] == "| bob | ✓ |  | ✗ | 1/3 |"


def test_labkit_room_command(
    tmp_path: Path, recording: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    check_integer("00.1", 7, 7, "right", "hint")
    assert labkit_main(["room", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| learner | 00.1 | passed |" in out and "✓ | 1/1 |" in out
    (tmp_path / "empty").mkdir()
    assert labkit_main(["room", str(tmp_path / "empty")]) == 1
    assert "no learners' progress found" in capsys.readouterr().err
    assert labkit_main(["room", str(tmp_path / "nobody-here")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    assert labkit_main(["room", "--group", "no-such-group-labkit"]) == 1  # no hub started yet
    assert capsys.readouterr().err.startswith(
        "group no-such-group-labkit does not exist yet: `make hub` (as root) creates it"
    )


def test_room_reads_the_groups_members_homes() -> None:
    assert room.learner_files("no-such-group-labkit") == []
    import grp
    import pwd

    root = pwd.getpwuid(0)
    group = grp.getgrgid(root.pw_gid).gr_name
    files = dict(room.learner_files(group))
    assert files[root.pw_name] == Path(root.pw_dir) / progress.WORK_DIR / progress.FILE_NAME
