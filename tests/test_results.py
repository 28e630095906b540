"""Result files are replaced atomically: an interrupted write leaves the previous version."""

import json
import os

import numpy as np
import pytest

from fedvls_flwr.app import results
from fedvls_flwr.app.results import RunWriter, load_arrays, read_rounds, summarize


def test_interrupted_write_keeps_the_previous_version(tmp_path, monkeypatch):
    writer = RunWriter(tmp_path)
    writer.append_round({"round": 1, "accuracy": 0.5})
    writer.save_checkpoint({"w": np.ones(3, np.float32)})

    def crash(src, dst):  # the process dies between writing the temp file and the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(results.os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        writer.append_round({"round": 2, "accuracy": 0.6})
    with pytest.raises(KeyboardInterrupt):
        writer.save_checkpoint({"w": np.zeros(3, np.float32)})
    monkeypatch.setattr(results.os, "replace", os.replace)

    assert read_rounds(tmp_path) == [{"round": 1, "accuracy": 0.5}]
    np.testing.assert_array_equal(load_arrays(tmp_path / results.CHECKPOINT_FILE)["w"], np.ones(3))
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_json_has_no_nan_and_summary_picks_best_and_final(tmp_path):
    writer = RunWriter(tmp_path)
    for r, acc in [(0, 0.1), (1, 0.7), (2, 0.9), (3, 0.8)]:
        writer.append_round({"round": r, "accuracy": acc, "per_class_accuracy": [float("nan"), acc]})
    assert json.loads((tmp_path / "rounds.jsonl").read_text().splitlines()[1])["per_class_accuracy"][0] is None
    s = summarize(writer.rounds)
    assert (s["best_accuracy"], s["best_round"], s["final_accuracy"], s["final_round"]) == (0.9, 2, 0.8, 3)


def test_arrays_given_as_npy_bytes_are_stored_as_they_are_and_read_back_as_np_savez_would(tmp_path):
    """The checkpoint takes a Flower Array's .npy payload without decoding it: the file reads back
    (np.load) the same arrays as one np.savez writes from the values."""
    import numpy as np
    from flwr.app import Array, ArrayRecord

    from fedvls_flwr.app.messages import npy_payloads
    from fedvls_flwr.app.results import save_arrays

    values = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "step": np.asarray(7, dtype=np.int64),
              "mask": np.array([True, False]), "half": np.ones((2, 2), dtype=np.float16), "empty": np.zeros((0, 3))}
    payloads = npy_payloads(ArrayRecord({k: Array(v) for k, v in values.items()}))
    assert all(isinstance(p, bytes) for p in payloads.values())
    save_arrays(tmp_path / "a.npz", {**payloads, "round": np.asarray(3)})
    np.savez(tmp_path / "b.npz", **values, round=np.asarray(3))
    got, want = load_arrays(tmp_path / "a.npz"), load_arrays(tmp_path / "b.npz")
    assert list(got) == list(want)
    for key in want:
        assert got[key].dtype == want[key].dtype and got[key].shape == want[key].shape
        np.testing.assert_array_equal(got[key], want[key])


def test_arrays_that_stopped_changing_are_written_once_beside_the_checkpoints(tmp_path):
    """A large array equal in two checkpoints in a row goes to a frozen file written once; every
    checkpoint read back is what was saved; one that changes again is written inline again; the
    frozen file no checkpoint names is removed; the same arrays give the same file."""
    from fedvls_flwr.app.messages import npy_array

    def payload(value):
        return npy_array(np.asarray(value, np.float32)).data

    big = payload(np.arange(results.FROZEN_MIN_BYTES // 4, dtype=np.float32))
    other = payload(np.ones(results.FROZEN_MIN_BYTES // 4))
    writer = RunWriter(tmp_path)
    frozen_files = []
    for server_round in range(1, 6):
        arrays = {"encoder": big, "head": payload(np.full(3, server_round)),
                  "late": other if server_round < 4 else payload(np.full(results.FROZEN_MIN_BYTES // 4, server_round))}
        writer.save_checkpoint(arrays, server_round)
        done, loaded = results.load_checkpoint(tmp_path / results.CHECKPOINT_FILE)
        assert done == server_round and loaded.keys() == arrays.keys()
        for key, value in arrays.items():
            np.testing.assert_array_equal(loaded[key], np.load(__import__("io").BytesIO(value)))
        frozen_files.append(sorted(p.name for p in tmp_path.glob(f"{results.FROZEN_FILE_PREFIX}*.npz")))
        inline = load_arrays(tmp_path / results.CHECKPOINT_FILE)
        if server_round == 1:
            assert frozen_files[-1] == [] and "encoder" in inline
        else:  # from round 2 on, the unchanged encoder is not in the checkpoint
            assert len(frozen_files[-1]) == 1 and "encoder" not in inline and "head" in inline
        assert ("late" in inline) == (server_round in (1, 4, 5))
    assert frozen_files[1] == frozen_files[2] == frozen_files[3] == frozen_files[4]  # written in round 2 only
    again = RunWriter(tmp_path / "again")  # a resumed run's writer: the same frozen arrays, the same file name
    again.save_checkpoint({"encoder": big, "late": other}, 1)
    again.save_checkpoint({"encoder": big, "late": other}, 2)
    assert sorted(p.name for p in (tmp_path / "again").glob(f"{results.FROZEN_FILE_PREFIX}*.npz")) == frozen_files[1]
    again.save_checkpoint({"encoder": big, "late": payload(np.zeros(results.FROZEN_MIN_BYTES // 4))}, 3)
    again.save_checkpoint({"encoder": big, "late": payload(np.zeros(results.FROZEN_MIN_BYTES // 4))}, 4)
    assert len(list((tmp_path / "again").glob(f"{results.FROZEN_FILE_PREFIX}*.npz"))) == 1  # the stale one removed


def test_a_missing_frozen_file_ends_the_resume_naming_it(tmp_path):
    writer = RunWriter(tmp_path)
    big = np.zeros(results.FROZEN_MIN_BYTES // 4, np.float32)
    from fedvls_flwr.app.messages import npy_array

    for server_round in (1, 2):
        writer.append_round({"round": server_round, "accuracy": 0.5})
        writer.save_checkpoint({"encoder": npy_array(big).data}, server_round)
    (frozen,) = tmp_path.glob(f"{results.FROZEN_FILE_PREFIX}*.npz")
    frozen.unlink()
    with pytest.raises(results.RunFolderError, match=f"resume: {frozen} is missing"):
        results._load_checkpoint_for_resume(tmp_path / results.CHECKPOINT_FILE, 2)


def test_a_damaged_frozen_file_is_named_not_the_intact_checkpoint(tmp_path):
    from fedvls_flwr.app.messages import npy_array

    writer = RunWriter(tmp_path)
    big = npy_array(np.zeros(results.FROZEN_MIN_BYTES // 4, np.float32)).data
    for server_round in (1, 2):
        writer.append_round({"round": server_round, "accuracy": 0.5})
        writer.save_checkpoint({"encoder": big}, server_round)
    (frozen,) = tmp_path.glob(f"{results.FROZEN_FILE_PREFIX}*.npz")
    frozen.write_bytes(frozen.read_bytes()[: frozen.stat().st_size // 2])
    with pytest.raises(results.RunFolderError, match=f"resume: {frozen} is damaged .*which is intact"):
        results._load_checkpoint_for_resume(tmp_path / results.CHECKPOINT_FILE, 2)


def test_no_frozen_file_outlives_the_checkpoint_that_named_it(tmp_path):
    """Frozen arrays that change again (the checkpoint holds everything again), and a resumed
    run's new writer, whose first checkpoint names no frozen file: no file is left unnamed."""
    from fedvls_flwr.app.messages import npy_array

    def big(value):
        return npy_array(np.full(results.FROZEN_MIN_BYTES // 4, value, np.float32)).data

    def frozen_files(folder):
        return list(folder.glob(f"{results.FROZEN_FILE_PREFIX}*.npz"))

    writer = RunWriter(tmp_path)
    writer.save_checkpoint({"encoder": big(1)}, 1)
    writer.save_checkpoint({"encoder": big(1)}, 2)
    assert len(frozen_files(tmp_path)) == 1
    writer.save_checkpoint({"encoder": big(2)}, 3)  # changed again: held in the checkpoint
    assert frozen_files(tmp_path) == []
    writer.save_checkpoint({"encoder": big(2)}, 4)
    assert len(frozen_files(tmp_path)) == 1
    resumed = RunWriter(tmp_path)  # a resumed run: its first checkpoint holds everything
    resumed.save_checkpoint({"encoder": big(2)}, 5)
    assert frozen_files(tmp_path) == []
    np.testing.assert_array_equal(results.load_checkpoint(tmp_path / results.CHECKPOINT_FILE)[1]["encoder"],
                                  np.full(results.FROZEN_MIN_BYTES // 4, 2, np.float32))
