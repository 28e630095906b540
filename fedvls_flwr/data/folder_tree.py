"""The file list of a node-local image folder (ImageFolder layout), without reading an image:
torch-free, so that a launcher can check a node's folder before it starts anything."""

from __future__ import annotations

import os
from pathlib import Path

from fedvls_flwr.data.errors import DatasetNotFoundError

FOLDER_IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".ppm", ".pgm", ".tif", ".tiff")


def _folder_help(root: Path, classes: tuple[str, ...]) -> str:
    shown = ", ".join(classes[:5]) + (", ..." if len(classes) > 5 else "")
    return (
        f"Expected an ImageFolder-style tree: {root}/<class name>/<image>"
        f"({'|'.join(e.lstrip('.') for e in FOLDER_IMAGE_EXTENSIONS[:3])}|...), one folder per class "
        f"of the class list ({shown}); sub-folders inside a class folder are read too."
    )


def folder_image_list(root: Path, classes: tuple[str, ...] | list[str]) -> list[tuple[str, int]]:
    """``[(path relative to root, label)]`` for every image of the tree, sorted.

    A class of ``classes`` without a folder is a vacant class (no error); a class folder
    whose name is not in ``classes`` is an error (its label would be undefined). Hidden
    entries (``.name``) and files directly under ``root`` are ignored.
    """
    root = Path(root)
    classes = tuple(classes)
    if not classes:
        raise ValueError("folder dataset: the class list is empty; give classes=\"name0,name1,...\"")
    if len(set(classes)) != len(classes):
        twice = sorted({c for c in classes if classes.count(c) > 1})
        raise ValueError(f"folder dataset: the class list names {', '.join(twice)} more than once")
    if not root.is_dir():
        raise DatasetNotFoundError(
            f"folder dataset not found: {root} does not exist or is not a folder. " + _folder_help(root, classes)
        )
    try:
        folders = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    except OSError as e:
        raise DatasetNotFoundError(f"folder dataset: cannot list {root}: {e}") from e
    unknown = [f for f in folders if f not in classes]
    if unknown:
        shown = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise ValueError(
            f"folder dataset {root}: class folder(s) {shown} are not in the class list "
            f"({len(classes)} names); add them to the list (its order fixes the label ids, "
            f"so every node must use the same list) or move the folders out"
        )
    out: list[tuple[str, int]] = []
    seen = {_folder_id(root): root}  # every folder read, by (device, inode): links are followed
    for label, name in enumerate(classes):
        base = root / name
        if not base.is_dir():
            continue  # vacant class on this node
        for dirpath, dirnames, filenames in os.walk(base, followlinks=True):
            again = seen.setdefault(_folder_id(Path(dirpath)), Path(dirpath))
            if again != Path(dirpath):
                raise ValueError(
                    f"folder dataset {root}: {dirpath} is the folder {again} again (through a symbolic link): "
                    "its images would be read twice, or for ever in a loop; remove the link, or copy the "
                    "images into the class folder they belong to"
                )
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            rel_dir = Path(dirpath).relative_to(root)
            for fname in sorted(filenames):
                if not fname.startswith(".") and fname.lower().endswith(FOLDER_IMAGE_EXTENSIONS):
                    out.append(((rel_dir / fname).as_posix(), label))
    if not out:
        raise DatasetNotFoundError(f"folder dataset {root}: no images found. " + _folder_help(root, classes))
    out.sort()
    return out


def _folder_id(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_dev, st.st_ino
