"""onnxtrain.data: the dataset file, the converters (npy, npz, CSV, image folders) and the fit to a model."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest

from onnxtrain.data import (
    Dataset,
    DatasetError,
    data_spec,
    fit_dataset,
    load_dataset,
    read_any,
    read_csv,
    read_image_folder,
    reshape,
    save_dataset,
)


# -- the dataset file -----------------------------------------------------------------------------------------------
def test_roundtrip_with_classes(tmp_path):
    ds = Dataset(np.random.rand(5, 3).astype(np.float32), np.array([0, 1, 2, 1, 0]), ["a", "b", "c"])
    save_dataset(ds, tmp_path / "d.npz")
    back = load_dataset(tmp_path / "d.npz")
    assert np.array_equal(back.x, ds.x) and np.array_equal(back.y, ds.y) and back.classes == ["a", "b", "c"]
    assert "5 examples" in back.describe() and "3 classes (a, b, c)" in back.describe()
    with np.load(tmp_path / "d.npz", allow_pickle=False) as npz:  # plain numpy reads it
        assert sorted(npz.files) == ["classes", "x", "y"]


@pytest.mark.parametrize("arrays, message", [
    ({"x": np.zeros((3, 2)), "y": np.zeros(2)}, "x has 3 examples but y has 2"),
    ({"x": np.zeros((0, 2)), "y": np.zeros(0)}, "holds no examples"),
    ({"x": np.array([[1.0, np.nan]]), "y": np.zeros(1)}, "NaN or infinite"),
    ({"x": np.array(["a", "b"]), "y": np.zeros(2)}, "expected numbers"),
    ({"x": np.zeros((2, 2)), "y": np.array([0, 5]), "classes": np.array(["a", "b"])}, "2 class names"),
    ({"x": np.zeros((2, 2))}, "no array 'y'"),
    ({"x": np.array([{"a": 1}], dtype=object), "y": np.zeros(1)}, "pickled"),
])
def test_bad_dataset_files(tmp_path, arrays, message):
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(DatasetError, match=message):
        load_dataset(tmp_path / "bad.npz")


def test_arrays_named_otherwise_get_the_conversion_command(tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "mine.npz", image=rng.random((6, 4, 4, 3), dtype=np.float32), label=rng.integers(0, 3, 6))
    with pytest.raises(DatasetError) as caught:
        load_dataset(tmp_path / "mine.npz")
    command = str(caught.value).split("`")[1]
    assert command.endswith("--x-key image --y-key label"), command
    out = tmp_path / "mine_xy.npz"
    assert f"-o {out}" in command
    # the command it names does the conversion
    args = command.split()[2:]
    subprocess.run([sys.executable, "-m", "onnxtrain.cli", "data", *args], check=True, capture_output=True)
    converted = load_dataset(out)
    assert converted.x.shape == (6, 4, 4, 3) and converted.y.shape == (6,)


def test_missing_folder_and_non_zip(tmp_path):
    with pytest.raises(DatasetError, match="not found"):
        load_dataset(tmp_path / "nope.npz")
    with pytest.raises(DatasetError, match="is a folder"):
        load_dataset(tmp_path)
    (tmp_path / "t.csv").write_text("1,2\n")
    with pytest.raises(DatasetError, match="onnxtrain data"):
        load_dataset(tmp_path / "t.csv")
    zipped = tmp_path / "cut.npz"
    np.savez(zipped, x=np.zeros((100, 10)), y=np.zeros(100))
    zipped.write_bytes(zipped.read_bytes()[:-200])
    with pytest.raises(DatasetError):
        load_dataset(zipped)


# -- CSV -----------------------------------------------------------------------------------------------------------
def _csv(tmp_path, text, name="d.csv"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_csv_header_text_labels_and_index_labels(tmp_path):
    ds = read_csv(_csv(tmp_path, "a,b,kind\n1,2,cat\n3,4,dog\n5,6,cat\n"))
    assert ds.x.tolist() == [[1, 2], [3, 4], [5, 6]] and ds.y.tolist() == [0, 1, 0] and ds.classes == ["cat", "dog"]
    ds = read_csv(_csv(tmp_path, "0;1.5;2\n1;2.5;0\n"), label_column=0)  # no header, ';', label first
    assert ds.y.dtype == np.int64 and ds.y.tolist() == [0, 1] and ds.x.tolist() == [[1.5, 2], [2.5, 0]]
    ds = read_csv(_csv(tmp_path, "x1,x2,target\n1,2,0.5\n3,4,1.25\n"), label_column="target")
    assert ds.y.dtype == np.float32 and ds.classes is None
    ds = read_csv(_csv(tmp_path, "1\t2\t3\n4\t5\t6\n", "d.tsv"))
    assert ds.x.shape == (2, 2)


@pytest.mark.parametrize("text, kwargs, message", [
    ("a,b,c\n1,2,0\n3,x,1\n", {}, "line 3, column 'b': 'x' is not a number"),
    ("a,b,c\n1,2,0\n3,1\n", {}, "line 3: 2 fields"),
    ("a,b\n1,0\n", {"label_column": "z"}, "no column 'z'"),
    ("1,0\n", {"label_column": 5}, "out of range"),
    ("a\n1\n2\n", {}, "single column"),
    ("a,b\n", {}, "no data rows"),
    ("\n\n", {}, "is empty"),
])
def test_bad_csv(tmp_path, text, kwargs, message):
    with pytest.raises(DatasetError, match=message):
        read_csv(_csv(tmp_path, text), **kwargs)


# -- npy / npz -------------------------------------------------------------------------------------------------------
def test_npy_npz_and_unknown_files(tmp_path):
    np.save(tmp_path / "x.npy", np.ones((4, 2)))
    np.save(tmp_path / "y.npy", np.arange(4))
    ds = read_any(str(tmp_path / "x.npy"), labels=str(tmp_path / "y.npy"))
    assert ds.x.shape == (4, 2) and ds.y.tolist() == [0, 1, 2, 3]
    with pytest.raises(DatasetError, match="--labels"):
        read_any(str(tmp_path / "x.npy"))
    np.save(tmp_path / "y3.npy", np.arange(3))  # the message named neither file: "x has 4 examples but y has 3"
    with pytest.raises(DatasetError, match=r"x\.npy holds 4 examples but the labels .*y3\.npy hold 3"):
        read_any(str(tmp_path / "x.npy"), labels=str(tmp_path / "y3.npy"))
    (tmp_path / "fake.npy").write_bytes(b"hello")
    with pytest.raises(DatasetError, match="not a .npy file"):
        read_any(str(tmp_path / "fake.npy"), labels=str(tmp_path / "y.npy"))
    np.savez(tmp_path / "d.npz", images=np.ones((4, 2)), labels=np.arange(4))
    with pytest.raises(DatasetError, match="--x-key"):
        read_any(str(tmp_path / "d.npz"))
    assert read_any(str(tmp_path / "d.npz"), x_key="images", y_key="labels").x.shape == (4, 2)
    (tmp_path / "d.xyz").write_bytes(b"")
    with pytest.raises(DatasetError, match="unknown file type"):
        read_any(str(tmp_path / "d.xyz"))
    with pytest.raises(DatasetError, match="cannot reshape"):
        reshape(ds, (3,))
    assert reshape(ds, (1, 2, 1)).x.shape == (4, 1, 2, 1)


# -- image folders --------------------------------------------------------------------------------------------------
def _images(root, sizes, mode="L"):
    Image = pytest.importorskip("PIL.Image")
    for label, size in sizes.items():
        os.makedirs(root / label, exist_ok=True)
        for i in range(2):
            Image.new(mode, size, color=(i * 100) if mode == "L" else (i * 100, 0, 0)).save(root / label / f"{i}.png")
    return str(root)


def test_image_folder(tmp_path):
    ds = read_image_folder(_images(tmp_path / "g", {"cat": (6, 4), "dog": (6, 4)}))
    assert ds.x.shape == (4, 1, 4, 6) and ds.x.dtype == np.float32 and ds.classes == ["cat", "dog"]
    assert ds.y.tolist() == [0, 0, 1, 1] and ds.x.max() == pytest.approx(100 / 255)
    ds = read_image_folder(_images(tmp_path / "c", {"a": (5, 5), "b": (7, 3)}, "RGB"), size=(4, 4))
    assert ds.x.shape == (4, 3, 4, 4)
    assert read_image_folder(str(tmp_path / "g"), color="rgb").x.shape[1] == 3


def test_bad_image_folders(tmp_path):
    with pytest.raises(DatasetError, match="images differ in size.*--image-size"):
        read_image_folder(_images(tmp_path / "s", {"a": (5, 5), "b": (7, 3)}))
    # as torchvision's ImageFolder: a file without an image extension is not an example; a broken image is an error
    (tmp_path / "s" / "b" / "notes.txt").write_text("hi")
    with pytest.warns(UserWarning, match="1 files without an image extension .*notes.txt"):
        assert len(read_image_folder(str(tmp_path / "s"), size=(4, 4))) == 4
    (tmp_path / "s" / "b" / "broken.png").write_text("hi")
    with pytest.raises(DatasetError, match="broken.png as an image"):
        read_image_folder(str(tmp_path / "s"), size=(4, 4))
    os.makedirs(tmp_path / "e" / "empty")
    with pytest.raises(DatasetError, match="holds no images"):
        read_image_folder(str(tmp_path / "e"))
    os.makedirs(tmp_path / "flat")
    with pytest.raises(DatasetError, match="no sub-folders"):
        read_image_folder(str(tmp_path / "flat"))


def test_image_folder_without_pillow(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(DatasetError, match="needs Pillow"):
        read_image_folder(str(tmp_path))


# -- fitting a dataset to a model -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cnn_spec(tmp_path_factory):
    from onnxtrain.artifacts import LossType, OptimType, generate_artifacts
    from onnxtrain.blocks import CrossEntropyLoss
    from onnxtrain.demo.model import build_cnn

    folder = tmp_path_factory.mktemp("spec")
    generate_artifacts(build_cnn(0), loss=LossType.CrossEntropyLoss, optimizer=OptimType.SGD,
                       artifact_directory=folder / "a", additional_output_names=["logits"])
    generate_artifacts(build_cnn(0), loss=CrossEntropyLoss(ignore_index=-1), artifact_directory=folder / "b")
    return tuple(data_spec(onnx.load(folder / name / "eval_model.onnx")) for name in ("a", "b"))


def test_data_spec(cnn_spec):
    spec, ignoring = cnn_spec
    assert spec.input.name == "image" and spec.label.dtype == np.int64
    assert spec.num_classes == 10 and spec.predictions == "logits" and spec.ignore_index is None
    assert ignoring.ignore_index == -1 and ignoring.predictions is None


def test_fit_casts_and_reshapes(cnn_spec):
    spec, ignoring = cnn_spec
    x, y = fit_dataset(Dataset(np.zeros((3, 8, 8)), np.array([0.0, 9.0, 1.0])), spec, "d")
    assert x.shape == (3, 1, 8, 8) and x.dtype == np.float32 and y.dtype == np.int64
    _, y = fit_dataset(Dataset(np.zeros((2, 1, 8, 8), np.float32), np.array([-1, 3])), ignoring, "d")
    assert y.tolist() == [-1, 3]  # the ignore_index is a valid label


@pytest.mark.parametrize("x, y, message", [
    (np.zeros((2, 64), np.float32), np.array([0, 1]), r"\[2, 64\].*\[N, 1, 8, 8\].*--shape 1,8,8"),
    (np.zeros((2, 1, 8, 8), np.uint8), np.array([0, 1]), "uint8.*--scale 255"),
    (np.zeros((2, 1, 8, 8), np.float32), np.array([0, 10]), r"label 10 \(example 1\).*\[0, 9\]"),
    (np.zeros((2, 1, 8, 8), np.float32), np.array([-1, 0]), "label -1"),
    # torch's padding label without an ignore_index on the loss: say how to declare it
    (np.zeros((2, 1, 8, 8), np.float32), np.array([0, -100]), r"label -100 .*--ignore-index -100$"),
    (np.zeros((2, 1, 8, 8), np.float32), np.array([0.5, 1.0]), "fractional"),
    # another number of values: no reshape to suggest (it would scramble or not fit)
    (np.zeros((2, 7), np.float32), np.array([0, 1]), r"\(64 values per example, these have 7\)$"),
])
def test_fit_errors(cnn_spec, x, y, message):
    with pytest.raises(DatasetError, match=message):
        fit_dataset(Dataset(x, y), cnn_spec[0], "d")


# -- the command --------------------------------------------------------------------------------------------------
def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "onnxtrain.cli", "data", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True)


def test_data_command(tmp_path):
    _csv(tmp_path, "a,b,c,d,label\n" + "".join(f"{i},{i},{i},{i},{i % 2}\n" for i in range(6)))
    proc = _cli("d.csv", "-o", "d.npz", "--shape", "1,2,2", "--scale", "2", "--num-classes", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    ds = load_dataset(tmp_path / "d.npz")
    assert ds.x.shape == (6, 1, 2, 2) and ds.x[2].max() == 1.0 and ds.y.tolist() == [0, 1, 0, 1, 0, 1]
    for args, message in ((["d.csv", "-o", "e.npz", "--num-classes", "1"], "out of range for --num-classes 1"),
                          (["d.csv", "-o", "e.npz", "--shape", "3"], "cannot reshape"),
                          (["d.csv", "-o", "e.npz", "--shape", "a,b"], "comma-separated integers"),
                          (["missing.csv", "-o", "e.npz"], "file not found"),
                          (["d.csv", "-o", "nodir/e.npz"], "does not exist")):
        proc = _cli(*args, cwd=tmp_path)
        err = proc.stderr.strip()
        assert proc.returncode != 0 and len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert err.startswith("onnxtrain: error: ") and message in err, err


def test_channels_last_images_get_a_transpose_not_a_reshape(tmp_path):
    """[N, 64, 64, 3] for a [N, 3, 64, 64] model used to get "--shape 3,64,64", which scrambles every image."""
    from onnxtrain.data.match import DataSpec
    from onnxtrain.runtime.backends.base import TensorMeta

    spec = DataSpec(TensorMeta("image", np.dtype(np.float32), ("N", 3, 64, 64)),
                    TensorMeta("labels", np.dtype(np.int64), ("N",)))
    with pytest.raises(DatasetError, match=r"look channels-last .*x.transpose\(0, 3, 1, 2\)") as info:
        fit_dataset(Dataset(np.zeros((2, 64, 64, 3), np.float32), np.array([0, 1])), spec, "d")
    assert "--shape" not in str(info.value)


def test_token_ids_stored_as_floats_are_cast_and_fractions_get_the_dtype_option():
    """`onnxtrain data` writes float32 by default: integral values fit an int64 input (token ids) as they are."""
    from onnxtrain.data.match import DataSpec
    from onnxtrain.runtime.backends.base import TensorMeta

    spec = DataSpec(TensorMeta("input_ids", np.dtype(np.int64), ("N", 4)),
                    TensorMeta("labels", np.dtype(np.int64), ("N",)))
    x, _ = fit_dataset(Dataset(np.array([[1, 2, 3, 4]], np.float32), np.array([1])), spec, "d")
    assert x.dtype == np.int64 and x.tolist() == [[1, 2, 3, 4]]
    with pytest.raises(DatasetError, match="--dtype int64"):
        fit_dataset(Dataset(np.array([[1.5, 2, 3, 4]], np.float32), np.array([1])), spec, "d")


def test_onert_raw_files_and_one_hot_labels(tmp_path):
    """ONERT's raw data (generate_datafile, onert_train --load_input:raw): float32 values one after the other and
    one-hot expected outputs, which become class indices; a one-hot .npz gets a hint instead of a bare shape error."""
    from onnxtrain.data import read_any

    rng = np.random.default_rng(0)
    x = rng.random((5, 1, 4, 4)).astype(np.float32)
    classes = np.array([0, 2, 1, 2, 0])
    x.tofile(tmp_path / "input.bin")
    np.eye(3, dtype=np.float32)[classes].tofile(tmp_path / "expected.bin")
    ds = read_any(str(tmp_path / "input.bin"), labels=str(tmp_path / "expected.bin"), shape=(1, 4, 4))
    np.testing.assert_array_equal(ds.x, x)
    assert ds.y.dtype == np.int64 and ds.y.tolist() == classes.tolist()
    kept = read_any(str(tmp_path / "input.bin"), labels=str(tmp_path / "expected.bin"), shape=(1, 4, 4),
                    keep_one_hot=True)   # targets of an MSE loss, as ONE's MNIST how-to trains
    np.testing.assert_array_equal(kept.y, np.eye(3, dtype=np.float32)[classes])
    with pytest.raises(DatasetError, match="--shape"):
        read_any(str(tmp_path / "input.bin"), labels=str(tmp_path / "expected.bin"))
    with pytest.raises(DatasetError, match="not a whole number of examples"):
        read_any(str(tmp_path / "input.bin"), labels=str(tmp_path / "expected.bin"), shape=(1, 3, 3))
    from onnxtrain.data.match import DataSpec
    from onnxtrain.runtime.backends.base import TensorMeta

    spec = DataSpec(TensorMeta("x", np.dtype(np.float32), ("N", 1, 4, 4)), TensorMeta("labels", np.dtype(np.int64),
                                                                                     ("N",)))
    with pytest.raises(DatasetError, match=r"look one-hot: .*np.argmax\(y, axis=-1\)"):
        fit_dataset(Dataset(x, np.eye(3, dtype=np.float32)[classes]), spec, "d")


def test_raw_files_of_a_partial_float_and_npy_labels(tmp_path):
    """A raw file whose size is not a multiple of 4 bytes was read short and reported as "250 float32 values";
    an .npy label file given with a raw input was read as raw bytes (its header counted as values)."""
    from onnxtrain.data import read_any

    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    x.tofile(tmp_path / "input.bin")
    (tmp_path / "odd.bin").write_bytes(x.tobytes() + b"\0\0")
    np.save(tmp_path / "labels.npy", np.array([0, 1, 2, 0, 1, 2]))
    ds = read_any(str(tmp_path / "input.bin"), labels=str(tmp_path / "labels.npy"), shape=(4,))
    assert ds.y.tolist() == [0, 1, 2, 0, 1, 2] and ds.x.shape == (6, 4)
    with pytest.raises(DatasetError, match=r"odd.bin is 98 bytes, not a whole number of float32 values"):
        read_any(str(tmp_path / "odd.bin"), labels=str(tmp_path / "labels.npy"), shape=(4,))
    with pytest.raises(DatasetError, match=r"file not found: .*missing.bin"):
        read_any(str(tmp_path / "input.bin"), labels=str(tmp_path / "missing.bin"), shape=(4,))


@pytest.mark.parametrize("args, message", [
    (["d.csv", "--labels", "y.npy"], "--labels applies to an .npy file or a raw .bin file, but INPUT d.csv is a CSV "
                                     "file (its labels are one of its columns: --label-column)"),
    (["d.csv", "--image-size", "8x8"], "--image-size applies to a folder of images"),
    (["x.npy", "--labels", "y.npy", "--label-column", "0"], "--label-column applies to a CSV file"),
    (["d.npz", "--color", "gray"], "--color applies to a folder of images, but INPUT d.npz is an .npz file"),
])
def test_an_option_for_another_kind_of_input_is_refused(tmp_path, capsys, monkeypatch, args, message):
    """`onnxtrain data train.csv --labels y.npy` took the CSV's last column as the labels and ignored --labels."""
    from onnxtrain.cli.main import main

    monkeypatch.chdir(tmp_path)
    _csv(tmp_path, "a,b,label\n1,2,0\n3,4,1\n")
    np.save(tmp_path / "x.npy", np.zeros((2, 3), np.float32))
    np.save(tmp_path / "y.npy", np.array([0, 1]))
    np.savez(tmp_path / "d.npz", x=np.zeros((2, 3), np.float32), y=np.array([0, 1]))
    assert main(["data", *args, "-o", "out.npz"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("onnxtrain: error: ") and message in err, err
    assert not (tmp_path / "out.npz").exists()
    assert main(["data", args[0], *(["--labels", "y.npy"] if args[0] == "x.npy" else []), "-o", "out.npz"]) == 0
