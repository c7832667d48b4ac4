"""Task directories: reused when their task left them as made, removed otherwise."""

import os

import pytest

from agent.task.dirs import SPARE_DIR, STATE_FILE, WORK_DIR, TaskDirs
from agent.task.journal import append_state, read_state


@pytest.fixture
def dirs(tmp_path):
    (tmp_path / "tasks").mkdir()
    return TaskDirs(str(tmp_path / SPARE_DIR), keep=4)


def _run(dirs, tmp_path, name, record=None):
    """Make a task's directory and write its state as a task would; returns its path."""
    path = str(tmp_path / "tasks" / name)
    dirs.make(path)
    append_state(os.path.join(path, STATE_FILE), record or {"task_id": name, "state": "starting"})
    return path


def _inode(path):
    return os.stat(os.path.join(path, WORK_DIR)).st_ino


def test_a_clean_directory_is_reused_with_a_blank_state_file(dirs, tmp_path):
    first = _run(dirs, tmp_path, "t1.1", {"task_id": "t1", "secret": "x" * 100})
    inode = _inode(first)
    dirs.remove(first)
    assert not os.path.exists(first) and dirs.spares() == 1
    second = str(tmp_path / "tasks" / "t2.1")
    dirs.make(second)
    assert _inode(second) == inode and dirs.spares() == 0
    with open(os.path.join(second, STATE_FILE), "rb") as fh:
        assert (
            fh.read() == b"\n"
        )  # the last task's records are gone; not truncated to 0 (see _blank)
    with pytest.raises(ValueError):
        read_state(os.path.join(second, STATE_FILE))  # a blank state file holds no record
    assert os.listdir(os.path.join(second, WORK_DIR)) == []
    assert oct(os.stat(second).st_mode & 0o7777) == "0o700"
    append_state(os.path.join(second, STATE_FILE), {"task_id": "t2"})
    assert read_state(os.path.join(second, STATE_FILE)) == {"task_id": "t2"}


def _leave_file(path):
    (open(os.path.join(path, WORK_DIR, "out.txt"), "w")).close()


def _leave_dir(path):
    os.mkdir(os.path.join(path, WORK_DIR, "sub"))


def _chmod_work(path):
    os.chmod(os.path.join(path, WORK_DIR), 0o755)


def _chmod_state(path):
    os.chmod(os.path.join(path, STATE_FILE), 0o644)


def _file_beside(path):
    (open(os.path.join(path, "note"), "w")).close()


def _hard_link(path):
    os.link(os.path.join(path, STATE_FILE), os.path.join(os.path.dirname(path), "kept-link"))


def _xattr(path):
    try:
        os.setxattr(os.path.join(path, WORK_DIR), "user.mark", b"1")
    except OSError as exc:
        pytest.skip(f"no user xattrs here: {exc}")


def _work_replaced(path):
    os.rmdir(os.path.join(path, WORK_DIR))
    os.symlink("/tmp", os.path.join(path, WORK_DIR))


@pytest.mark.parametrize(
    "change",
    [
        _leave_file,
        _leave_dir,
        _chmod_work,
        _chmod_state,
        _file_beside,
        _hard_link,
        _xattr,
        _work_replaced,
    ],
)
def test_a_directory_its_task_changed_is_removed_not_reused(dirs, tmp_path, change):
    path = _run(dirs, tmp_path, "t1.1")
    inode = _inode(path)
    change(path)
    dirs.remove(path)
    assert not os.path.lexists(path) and dirs.spares() == 0
    assert os.listdir(tmp_path / SPARE_DIR) == []
    fresh = str(tmp_path / "tasks" / "t2.1")
    dirs.make(fresh)
    assert os.path.isdir(os.path.join(fresh, WORK_DIR)) and not os.path.islink(
        os.path.join(fresh, WORK_DIR)
    )
    assert os.listdir(os.path.join(fresh, WORK_DIR)) == []
    assert not os.path.exists(os.path.join(fresh, STATE_FILE)) or _inode(fresh) != inode


def test_spares_are_capped_and_a_missing_spare_falls_back_to_mkdir(dirs, tmp_path):
    paths = [_run(dirs, tmp_path, f"t{i}.1") for i in range(6)]
    for path in paths:
        dirs.remove(path)
    assert dirs.spares() == 4 and len(os.listdir(tmp_path / SPARE_DIR)) == 4
    assert os.listdir(tmp_path / "tasks") == []
    for name in os.listdir(tmp_path / SPARE_DIR):  # an operator cleans up behind the agent's back
        os.unlink(tmp_path / SPARE_DIR / name / STATE_FILE)
        os.rmdir(tmp_path / SPARE_DIR / name / WORK_DIR)
        os.rmdir(tmp_path / SPARE_DIR / name)
    path = str(tmp_path / "tasks" / "t9.1")
    dirs.make(path)
    assert os.path.isdir(os.path.join(path, WORK_DIR)) and dirs.spares() == 3


def test_make_where_an_earlier_try_left_the_directory(dirs, tmp_path):
    path = _run(dirs, tmp_path, "t1.1")
    dirs.remove(_run(dirs, tmp_path, "t2.1"))
    assert dirs.spares() == 1
    dirs.make(path)  # the spare cannot be renamed onto a directory that is there: made the old way
    assert os.path.isdir(os.path.join(path, WORK_DIR)) and dirs.spares() == 0
    assert read_state(os.path.join(path, STATE_FILE))["task_id"] == "t1.1"
    assert os.listdir(tmp_path / SPARE_DIR) == []


def test_spares_from_before_a_restart_are_removed_unchecked(tmp_path):
    dirs = TaskDirs(str(tmp_path / SPARE_DIR))
    path = str(tmp_path / "t1.1")
    dirs.make(path)
    append_state(os.path.join(path, STATE_FILE), {"task_id": "t1"})
    dirs.remove(path)
    assert len(os.listdir(tmp_path / SPARE_DIR)) == 1
    again = TaskDirs(str(tmp_path / SPARE_DIR))
    assert again.spares() == 0 and os.listdir(tmp_path / SPARE_DIR) == []


def test_keep_zero_removes_every_directory(tmp_path):
    dirs = TaskDirs(str(tmp_path / SPARE_DIR), keep=0)
    path = str(tmp_path / "t1.1")
    dirs.make(path)
    append_state(os.path.join(path, STATE_FILE), {"task_id": "t1"})
    dirs.remove(path)
    assert not os.path.exists(path) and not os.path.exists(tmp_path / SPARE_DIR)


def test_the_first_task_makes_the_tasks_directory_and_its_own_private(tmp_path):
    dirs = TaskDirs(str(tmp_path / SPARE_DIR))
    path = tmp_path / "state" / "tasks" / "t1.1"
    (tmp_path / "state").mkdir()
    dirs.make(str(path))
    for made in (path.parent, path, path / WORK_DIR):
        assert oct(made.stat().st_mode & 0o7777) == "0o700", made


def test_not_kept_when_the_caller_cannot_vouch_that_no_process_is_left(dirs, tmp_path):
    path = _run(dirs, tmp_path, "t1.1")
    dirs.remove(path, reuse=False)
    assert not os.path.exists(path) and dirs.spares() == 0
