"""A node's data from its --node-config: partition form, node-local folders, the disk cache."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from PIL import Image

from fedvls_flwr.config.run_config import parse_run_config
from fedvls_flwr.data import datasets as D
from fedvls_flwr.data import node_data as N
from fedvls_flwr.data.digits import digits_split
from fedvls_flwr.data.node_config import node_partition
from tests.tiny_data import DIGITS


@pytest.fixture(autouse=True)
def fresh_process_state(monkeypatch, tmp_path):
    """Each test starts like a fresh ClientApp process, with its own cache folder."""
    monkeypatch.setenv("FEDVLS_CACHE_DIR", str(tmp_path / "cache"))
    fresh_process()
    yield
    fresh_process()


def fresh_process() -> None:
    N._LOADED.clear()
    N._SAID.clear()
    N._PREPARED.clear()
    N._ANSWERED.clear()
    N._local_in_memory.cache_clear()


def cfg_for(**overrides):
    return parse_run_config({"dirichlet-beta": 0.5, **overrides})


def write_digit_folder(root, classes, per_class=None, size=None):
    """Digits pool images as 8-bit grayscale PNGs in root/<class>/<i>.png; returns (x01, y) written."""
    x, y, tr, _te, *_ = digits_split()
    written_x, written_y = [], []
    for c in classes:
        idx = [i for i in tr if y[i] == c][:per_class]
        (root / str(c)).mkdir(parents=True, exist_ok=True)
        for k, i in enumerate(idx):
            arr = np.rint(x[i] * 255).astype(np.uint8)
            img = Image.fromarray(arr, mode="L")
            if size:
                img = img.resize(size, Image.NEAREST)
            img.save(root / str(c) / f"{k:04d}.png")
            written_x.append(arr)
            written_y.append(c)
    return np.stack(written_x), np.array(written_y)


# ---------------------------------------------------------------------------
# partition form


def test_partition_form_matches_client_data_and_caches(tmp_path, monkeypatch):
    cfg = cfg_for()
    direct = N.client_data(cfg, 1, 3)
    fresh_process()
    got = N.node_client_data(cfg, {"partition-id": 1, "num-partitions": 3})
    assert torch.equal(got.x, direct.x) and torch.equal(got.y, direct.y)
    assert got.partition_id == 1 and got.num_classes == 10 and got.test_x is None
    files = list((tmp_path / "cache").glob("*.npz"))
    assert len(files) == 1

    # A new process reads the cache and never loads the dataset.
    fresh_process()
    monkeypatch.setattr(N, "load_dataset", lambda *a, **k: pytest.fail("dataset loaded despite the cache"))
    again = N.node_client_data(cfg, {"partition-id": 1, "num-partitions": 3})
    assert torch.equal(again.x, direct.x) and torch.equal(again.y, direct.y)
    assert again.partition_id == 1 and again.mean is None


def test_a_node_served_again_is_answered_from_memory_until_what_it_depends_on_changes(monkeypatch):
    """A process holding a node's partition answers the node's next messages with it, its node
    config not parsed again; it works the data out again when a run setting, the node config,
    the environment a relative data-dir is resolved against, or the dataset cache changes."""
    monkeypatch.delenv("FEDVLS_BASE_DIR", raising=False)  # whatever the shell running the tests set
    cfg = cfg_for(**{"data-dir": "fedvls-data"})
    node = {"partition-id": 1, "num-partitions": 3}
    N.dataset_for(cfg)  # the dataset in memory, as in a simulation's process
    first = N.node_client_data(cfg, node)
    assert N.node_client_data(cfg, node) is first  # found prepared, and kept as the answer
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(N, "parse_node_config", lambda *a: pytest.fail("the node config was parsed again"))
        assert N.node_client_data(cfg, dict(node)) is first
    other_seed = N.node_client_data(cfg_for(**{"data-dir": "fedvls-data", "seed": 1}), node)
    assert not torch.equal(other_seed.y, first.y)
    held_out = N.node_client_data(cfg, {**node, "test-fraction": 0.25})
    assert held_out.test_y is not None and first.test_y is None
    monkeypatch.setenv("FEDVLS_BASE_DIR", "/elsewhere")  # fedvls-data now means another folder
    moved = N.node_client_data(cfg, node)
    assert moved is not first and torch.equal(moved.x, first.x)
    monkeypatch.delenv("FEDVLS_BASE_DIR")
    assert N.node_client_data(cfg, node) is first
    D.clear_cache()  # the dataset forgotten: its partition is cut again from the one loaded next
    N.dataset_for(cfg)
    again = N.node_client_data(cfg, node)
    assert again is not first and torch.equal(again.x, first.x) and torch.equal(again.y, first.y)


def test_the_answers_kept_for_a_run_go_when_the_next_run_asks(monkeypatch):
    """A process that serves runs one after another (a sweep's worker) keeps the answers of the
    run it serves now only: the first answer of a new run drops those of the runs before."""
    monkeypatch.delenv("FEDVLS_BASE_DIR", raising=False)
    cfg = cfg_for(**{"data-dir": "fedvls-data"})
    nodes = [{"partition-id": i, "num-partitions": 3} for i in range(3)]
    N.dataset_for(cfg)
    data = {}
    for run_id in (1, 2):
        for node in nodes:
            N.node_client_data(cfg, node, run_id=run_id)  # prepared (run 1), or found prepared
            data[run_id, node["partition-id"]] = N.node_client_data(cfg, node, run_id=run_id)  # kept as the answer
        assert {key[0] for key in N._ANSWERED} == {run_id} and len(N._ANSWERED) == len(nodes)
    with pytest.MonkeyPatch.context() as patched:  # run 2's answers still answer
        patched.setattr(N, "parse_node_config", lambda *a: pytest.fail("the node config was parsed again"))
        assert all(N.node_client_data(cfg, node, run_id=2) is data[2, node["partition-id"]] for node in nodes)
    N.node_client_data(cfg, nodes[0], run_id=None)  # no run id: a run of its own
    assert {key[0] for key in N._ANSWERED} == {None} and len(N._ANSWERED) == 1


def test_a_node_read_from_the_disk_cache_is_kept_for_the_run(monkeypatch):
    """A process that never loads the whole dataset (a client worker of the in-process engine, a
    Ray actor) read a node's .npz again for every message: new tensors each time, so FedConcat's
    features kept for a node's data were computed again every head round (67 ms against 18 a
    head round with two workers). The node's data is now read once a run: the same tensors for
    its next messages; another run reads it again."""
    cfg = cfg_for()
    node = {"partition-id": 0, "num-partitions": 2}
    built = N.node_client_data(cfg, node, run_id=1)  # cut from the dataset, written to the disk cache
    fresh_process()  # a worker: the disk cache, nothing in memory
    reads: list[object] = []
    read = N._read_cache
    monkeypatch.setattr(N, "_read_cache", lambda *args: reads.append(args) or read(*args))
    first = N.node_client_data(cfg, node, run_id=1)
    assert len(reads) == 1 and torch.equal(first.x, built.x) and torch.equal(first.y, built.y)
    assert N.node_client_data(cfg, node, run_id=1) is first and len(reads) == 1
    other_run = N.node_client_data(cfg, node, run_id=2)
    assert len(reads) == 2 and other_run is not first and torch.equal(other_run.x, built.x)


def test_a_data_dir_pointed_elsewhere_between_runs_gives_the_new_data(tmp_path, monkeypatch):
    """A process that serves several runs (a sweep's worker) keeps a node's answer for one run
    only: a data-dir that is a symbolic link repointed between runs, or a relative one read from
    another working directory (a relative FEDVLS_BASE_DIR), gives the data now there in the next run."""
    from tests.tiny_data import write_idx_dataset

    one = write_idx_dataset(tmp_path / "one" / "MNIST" / "raw", n_train=60, n_test=20, seed=1)
    two = write_idx_dataset(tmp_path / "two" / "MNIST" / "raw", n_train=60, n_test=20, seed=2)
    assert not np.array_equal(one["train"][0], two["train"][0])
    link = tmp_path / "current"
    link.symlink_to(tmp_path / "one")
    cfg = cfg_for(dataset="mnist", **{"data-dir": str(link), "min-partition-size": 1})
    node = {"partition-id": 0, "num-partitions": 2}

    def direct(name):  # the partition read from the folder itself, not through the link
        at = cfg_for(dataset="mnist", **{"data-dir": str(tmp_path / name), "min-partition-size": 1})
        N.dataset_for(at)
        return N.node_client_data(at, node)

    def same(a, b):
        return torch.equal(a.x, b.x) and torch.equal(a.y, b.y)

    from_one_directly, from_two_directly = direct("one"), direct("two")
    assert not torch.equal(from_one_directly.x, from_two_directly.x)
    N.dataset_for(cfg)  # the dataset in memory, as in a simulation's process
    first = N.node_client_data(cfg, node, run_id=1)
    assert same(first, from_one_directly)
    assert N.node_client_data(cfg, node, run_id=1) is first  # answered from memory
    link.unlink()
    link.symlink_to(tmp_path / "two")
    N.dataset_for(cfg)
    second = N.node_client_data(cfg, node, run_id=2)
    assert same(second, from_two_directly)

    relative = cfg_for(dataset="mnist", **{"data-dir": "data", "min-partition-size": 1})
    for name in ("one", "two"):
        (tmp_path / f"cwd-{name}").mkdir()
        (tmp_path / f"cwd-{name}" / "data").symlink_to(tmp_path / name)
    monkeypatch.setenv("FEDVLS_BASE_DIR", ".")  # a relative base: the working directory
    monkeypatch.chdir(tmp_path / "cwd-one")
    N.dataset_for(relative)
    from_one = N.node_client_data(relative, node, run_id=3)
    monkeypatch.chdir(tmp_path / "cwd-two")
    N.dataset_for(relative)
    from_two = N.node_client_data(relative, node, run_id=3)
    assert same(from_one, from_one_directly) and same(from_two, from_two_directly)


def test_partition_cache_invalidated_by_settings(tmp_path):
    node = {"partition-id": 0, "num-partitions": 2}
    a = N.node_client_data(cfg_for(seed=0), node)
    fresh_process()
    b = N.node_client_data(cfg_for(seed=1), node)
    assert not torch.equal(a.y, b.y) or not torch.equal(a.x, b.x)
    # One file per node identity: the stale one was replaced.
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 1
    fresh_process()
    c = N.node_client_data(cfg_for(seed=1), node)
    assert torch.equal(c.x, b.x)


def test_cache_can_be_turned_off_and_moved(tmp_path):
    N.node_client_data(cfg_for(), {"partition-id": 0, "num-partitions": 2, "cache-dir": ""})
    assert not (tmp_path / "cache").exists()
    fresh_process()
    N.node_client_data(cfg_for(), {"partition-id": 0, "num-partitions": 2, "cache-dir": str(tmp_path / "elsewhere")})
    assert len(list((tmp_path / "elsewhere").glob("*.npz"))) == 1


def test_in_memory_dataset_skips_disk_cache(tmp_path):
    """A process that already holds the dataset (simulation actor) slices it directly."""
    cfg = cfg_for()
    N.dataset_for(cfg)
    N.node_client_data(cfg, {"partition-id": 0, "num-partitions": 4})
    assert not (tmp_path / "cache").exists()


def test_test_fraction_is_a_stratified_disjoint_split():
    cfg = cfg_for()
    whole = N.client_data(cfg, 0, 2)
    fresh_process()
    got = N.node_client_data(cfg, {"partition-id": 0, "num-partitions": 2, "test-fraction": 0.25})
    assert got.test_x is not None and got.test_y is not None
    assert got.num_examples + got.test_y.shape[0] == whole.num_examples
    counts = np.bincount(whole.y.numpy(), minlength=10)
    test_counts = np.bincount(got.test_y.numpy(), minlength=10)
    assert (test_counts == np.floor(0.25 * counts)).all()
    # Disjoint and complete: the multiset of rows is the partition's.
    rows = lambda t: sorted(map(tuple, t.reshape(t.shape[0], -1).numpy().round(5).tolist()))  # noqa: E731
    assert rows(torch.cat([got.x, got.test_x])) == rows(whole.x)
    # Stable: the same split from the cache.
    fresh_process()
    again = N.node_client_data(cfg, {"partition-id": 0, "num-partitions": 2, "test-fraction": 0.25})
    assert torch.equal(again.test_y, got.test_y) and torch.equal(again.x, got.x)


# ---------------------------------------------------------------------------
# node config errors


@pytest.mark.parametrize(
    ("node_config", "message"),
    [
        ({}, "lacks 'partition-id'"),
        ({"partition-id": 0}, "lacks 'num-partitions'"),
        ({"partition-id": 2, "num-partitions": 2}, "outside 0..1"),
        ({"data_dir": "/x"}, "did you mean 'data-dir'"),
        ({"dataset": "folder"}, "needs data-dir"),
        ({"dataset": "folder", "data-dir": "/x"}, "needs the class list"),
        ({"dataset": "imagenet", "data-dir": "/x"}, "not known"),
        ({"dataset": "folder", "data-dir": "/x", "classes": "a", "num-partitions": 2}, "mixes"),
        ({"partition-id": 0, "num-partitions": 2, "test-fraction": 1.0}, "test-fraction"),
        ({"dataset": "folder", "data-dir": "/x", "classes": "a,,b"}, "empty class name"),
        ({"dataset": "folder", "data-dir": "/x", "classes": "a,b,a"}, "more than once"),
    ],
)
def test_node_config_errors_are_clear(node_config, message):
    with pytest.raises(ValueError, match=message):
        N.node_client_data(cfg_for(), node_config)


def test_node_partition_keeps_working():
    assert node_partition({"partition-id": 3, "num-partitions": 5}) == (3, 5)
    with pytest.raises(ValueError, match="partition-id=<i> num-partitions=<n>"):
        node_partition({})


# ---------------------------------------------------------------------------
# node-local folders


def test_folder_data_with_vacant_classes_matches_the_run_representation(tmp_path):
    root = tmp_path / "site-a"
    x01, y = write_digit_folder(root, [1, 3, 7], per_class=5)
    cfg = cfg_for()
    node = {"dataset": "folder", "data-dir": str(root), "classes": DIGITS, "partition-id": 4}
    got = N.node_client_data(cfg, node)
    assert got.num_classes == 10 and got.partition_id == 4
    assert tuple(got.x.shape) == (15, 1, 8, 8) and got.x.dtype == torch.float32 and got.mean is None
    assert np.bincount(got.y.numpy(), minlength=10).tolist() == [0, 5, 0, 5, 0, 0, 0, 5, 0, 0]
    # Same normalisation as the digits bundle (up to 8-bit quantisation of the PNGs).
    fmt = D.image_format("digits")
    expected = (torch.from_numpy(x01).float() / 255 - fmt.mean[0]) / fmt.std[0]
    assert torch.allclose(got.x[:, 0], expected, atol=1e-5)
    bundle = D.load_dataset("digits", ".")
    first = bundle.train_x[bundle.train_y == 1][0, 0]
    assert torch.allclose(got.x[got.y == 1][0, 0], first, atol=0.5 / 255 / fmt.std[0] + 1e-5)


def test_folder_cache_hit_and_invalidation(tmp_path, monkeypatch, caplog):
    root = tmp_path / "site"
    write_digit_folder(root, [0, 2], per_class=3)
    node = {"dataset": "folder", "data-dir": str(root), "classes": DIGITS}
    first = N.node_client_data(cfg_for(), node)
    assert first.num_examples == 6

    fresh_process()
    real_loader = N.load_image_folder
    monkeypatch.setattr(N, "load_image_folder", lambda *a, **k: pytest.fail("re-read despite the cache"))
    with caplog.at_level(logging.INFO, logger="flwr"):
        hit = N.node_client_data(cfg_for(), node)
    assert torch.equal(hit.x, first.x) and "from the cache" in caplog.text
    assert hit.partition_id == first.partition_id  # stable derived site id

    # A new image changes the key: rebuilt, and the stale file removed.
    monkeypatch.setattr(N, "load_image_folder", real_loader)
    write_digit_folder(root, [5], per_class=2)
    fresh_process()
    more = N.node_client_data(cfg_for(), node)
    assert more.num_examples == 8
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 1


def test_folder_rgb_resized_to_the_run_format(tmp_path):
    root = tmp_path / "rgb"
    (root / "cat").mkdir(parents=True)
    (root / "dog").mkdir()
    rng = np.random.default_rng(0)
    for k in range(3):
        Image.fromarray(rng.integers(0, 255, (30, 40, 3), dtype=np.uint8)).save(root / "cat" / f"{k}.jpg")
    Image.fromarray(rng.integers(0, 255, (64, 64), dtype=np.uint8), mode="L").save(root / "dog" / "g.png")
    classes = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    got = N.node_client_data(
        cfg_for(dataset="cifar10"), {"dataset": "folder", "data-dir": str(root), "classes": ",".join(classes)}
    )
    assert got.x.dtype == torch.uint8 and tuple(got.x.shape) == (4, 3, 32, 32)
    assert got.mean == D.CIFAR10_MEAN and got.std == D.CIFAR10_STD
    assert sorted(got.y.tolist()) == [3, 3, 3, 5]


def test_folder_errors_name_the_problem(tmp_path):
    cfg = cfg_for()
    missing = tmp_path / "nowhere"
    with pytest.raises(D.DatasetNotFoundError, match=f"{missing} does not exist"):
        N.node_client_data(cfg, {"dataset": "folder", "data-dir": str(missing), "classes": DIGITS})

    root = tmp_path / "site"
    write_digit_folder(root, [0], per_class=2)
    (root / "eleven").mkdir()
    with pytest.raises(ValueError, match="class folder\\(s\\) eleven are not in the class list"):
        N.node_client_data(cfg, {"dataset": "folder", "data-dir": str(root), "classes": DIGITS})
    (root / "eleven").rmdir()

    with pytest.raises(ValueError, match="classes lists 3 names but the run's model"):
        N.node_client_data(cfg, {"dataset": "folder", "data-dir": str(root), "classes": "0,1,2"})

    (root / "0" / "broken.png").write_bytes(b"not an image")
    with pytest.raises(D.DatasetNotFoundError, match="cannot read image .*broken.png"):
        N.node_client_data(cfg, {"dataset": "folder", "data-dir": str(root), "classes": DIGITS})

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(D.DatasetNotFoundError, match="no images found"):
        N.node_client_data(cfg, {"dataset": "folder", "data-dir": str(empty), "classes": DIGITS})


def test_classes_file(tmp_path):
    root = tmp_path / "site"
    write_digit_folder(root, [9], per_class=2)
    names = tmp_path / "classes.txt"
    names.write_text("# label order\n" + "\n".join(str(i) for i in range(10)) + "\n")
    got = N.node_client_data(cfg_for(), {"dataset": "folder", "data-dir": str(root), "classes-file": str(names)})
    assert got.y.tolist() == [9, 9]


def test_named_dataset_node_local(tmp_path):
    got = N.node_client_data(cfg_for(), {"dataset": "digits", "data-dir": str(tmp_path), "partition-id": 2})
    bundle = D.load_dataset("digits", ".")
    assert torch.equal(got.x, bundle.train_x) and got.partition_id == 2
    with pytest.raises(ValueError, match="do not fit the run's model"):
        N.node_client_data(cfg_for(dataset="mnist10k"), {"dataset": "digits", "data-dir": str(tmp_path)})
    with pytest.raises(D.DatasetNotFoundError, match="cifar10 not found"):
        N.node_client_data(cfg_for(dataset="cifar10"), {"dataset": "cifar10", "data-dir": str(tmp_path)})


def test_image_format_table_matches_the_loaders():
    fmt = D.image_format("digits")
    bundle = D.load_dataset("digits", ".")
    assert fmt.shape == bundle.input_shape and fmt.num_classes == bundle.num_classes and fmt.normalised
    for name, shape, k in [("mnist10k", (1, 28, 28), 10), ("cifar100", (3, 32, 32), 100), ("tinyimagenet", (3, 64, 64), 200)]:
        f = D.image_format(name)
        assert (f.shape, f.num_classes) == (shape, k)


# ---- node data: odd folders, links and files ------------------------------------------------
def folder_node(root, **extra):
    return {"dataset": "folder", "data-dir": str(root), "classes": DIGITS, "cache-dir": "", **extra}


def test_one_class_other_files_and_other_sizes_work_as_documented(tmp_path):
    """A site with one class trains on it (the others are vacant); files without an image
    extension are not read; images of another size are resized to the run's format."""
    one = tmp_path / "one"
    write_digit_folder(one, [3], per_class=4)
    got = N.node_client_data(cfg_for(), folder_node(one))
    assert got.y.tolist() == [3, 3, 3, 3] and got.num_classes == 10

    mixed = tmp_path / "mixed"
    write_digit_folder(mixed, [1, 2], per_class=3, size=(50, 40))
    (mixed / "1" / "notes.txt").write_text("taken on monday")
    (mixed / "2" / "labels.csv").write_text("a,b\n")
    (mixed / "README.md").write_text("site a")  # directly under data-dir: not a class
    got = N.node_client_data(cfg_for(), folder_node(mixed))
    assert tuple(got.x.shape) == (6, 1, 8, 8) and sorted(got.y.tolist()) == [1, 1, 1, 2, 2, 2]


def test_a_class_folder_outside_the_classes_file_is_named(tmp_path):
    root = tmp_path / "site"
    write_digit_folder(root, [0], per_class=2)
    (root / "ten").mkdir()
    names = tmp_path / "classes.txt"
    names.write_text("\n".join(str(i) for i in range(10)) + "\n")
    with pytest.raises(ValueError, match=f"folder dataset {root}: class folder\\(s\\) ten are not in the class list"):
        N.node_client_data(cfg_for(), {"dataset": "folder", "data-dir": str(root), "classes-file": str(names)})


def test_unreadable_image_files_are_named_with_the_fix(tmp_path, monkeypatch):
    """We run as root, so chmod 000 does not stop a read: a dangling symbolic link, a link
    to itself, and (monkeypatched) a PermissionError stand for a file that cannot be read."""
    root = tmp_path / "site"
    write_digit_folder(root, [1], per_class=2)
    (root / "1" / "gone.png").symlink_to(tmp_path / "nowhere.png")
    with pytest.raises(D.DatasetNotFoundError) as err:
        N.node_client_data(cfg_for(), folder_node(root))
    assert f"cannot read image {root}/1/gone.png (a symbolic link that leads to no file)" in str(err.value)
    assert "replace it with a readable image or remove it" in str(err.value)
    (root / "1" / "gone.png").unlink()
    (root / "1" / "self.png").symlink_to(root / "1" / "self.png")
    with pytest.raises(D.DatasetNotFoundError, match="self.png .*Too many levels of symbolic links"):
        N.node_client_data(cfg_for(), folder_node(root))
    (root / "1" / "self.png").unlink()

    import fedvls_flwr.data.folder as F

    def denied(path, size, mode):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(F, "_decode_folder_image", denied)
    with pytest.raises(D.DatasetNotFoundError, match="cannot read image .*0000.png: PermissionError"):
        N.node_client_data(cfg_for(), folder_node(root))


def test_a_directory_named_like_an_image_is_a_sub_folder(tmp_path):
    root = tmp_path / "site"
    write_digit_folder(root, [1], per_class=2)
    (root / "1" / "x.png").mkdir()
    assert N.node_client_data(cfg_for(), folder_node(root)).num_examples == 2


def test_a_symlink_loop_is_refused_not_read_forty_times(tmp_path):
    """Followed, a link from a class folder to itself would be read until the kernel's limit
    of 40 links: 2 images would become 82 samples, silently."""
    root = tmp_path / "site"
    write_digit_folder(root, [1], per_class=2)
    (root / "1" / "again").symlink_to(root / "1")
    with pytest.raises(ValueError, match=f"{root}/1/again is the folder {root}/1 again \\(through a symbolic link\\)"):
        N.node_client_data(cfg_for(), folder_node(root))
    (root / "1" / "again").unlink()
    (root / "2").symlink_to(root)  # a class folder that is the data folder itself
    with pytest.raises(ValueError, match=f"{root}/2 is the folder {root} again"):
        N.node_client_data(cfg_for(), folder_node(root, **{"cache-dir": str(tmp_path / "c")}))


def test_a_process_serving_many_partitions_says_where_its_data_came_from_once(caplog):
    """A process serving many partitions (a simulation's Ray actor, the in-process engine)
    prepares each partition once, saying so at INFO for the first and DEBUG for the rest, and
    hands the same data to that partition's later messages (a deployment's ClientApp, one
    process per message, still says it every message)."""
    cfg = cfg_for()
    first: dict[int, object] = {}
    with caplog.at_level(logging.DEBUG, logger="flwr"):
        for _ in range(2):  # two rounds
            for pid in range(4):
                data = N.node_client_data(cfg, {"partition-id": pid, "num-partitions": 4})
                assert first.setdefault(pid, data) is data
    said = [r for r in caplog.records if r.getMessage().startswith("node data:")]
    assert [r.levelno for r in said] == [logging.INFO] + [logging.DEBUG] * 3
    fresh_process()  # the next message of a deployment: a new ClientApp process
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="flwr"):
        N.node_client_data(cfg, {"partition-id": 0, "num-partitions": 4})
    assert "node data: partition 0/4 of digits" in caplog.text and "from the cache" in caplog.text
