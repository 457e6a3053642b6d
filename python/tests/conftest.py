"""Shared fixtures: the repository, its model folder, the corpus, the `ragline` commands.

The tests run the installed package (scripts/test-python.sh installs ./python into a
virtualenv of its own) against the real all-MiniLM-L6-v2 (scripts/fetch-model.sh) and
react-docs from ../shared/data (a slice copied into tests/fixtures/react when it is absent).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
MINILM = "sentence-transformers/all-MiniLM-L6-v2"

# Hub ids are found under $RAGLINE_MODELS (where scripts/fetch-model.sh puts them).
os.environ.setdefault("RAGLINE_MODELS", str(MODELS))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def data_dir() -> Path:
    return Path(os.environ.get("RAGLINE_DATA_DIR", ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def model_ready():
    if not (MODELS / "all-MiniLM-L6-v2" / "model.safetensors").exists():
        pytest.fail("models/all-MiniLM-L6-v2 is missing: run scripts/fetch-model.sh")
    return MINILM


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    """Eight react-docs pages of 4-12 kB (../shared/data), else the two of
    tests/fixtures/react."""
    out = tmp_path_factory.mktemp("corpus")
    src = data_dir() / "react-docs" / "src" / "content" / "reference" / "react"
    if src.is_dir():
        pages = sorted(p for p in src.glob("*.md") if 4000 <= p.stat().st_size <= 12000)[:8]
    elif os.environ.get("RAGLINE_REQUIRE_DATA") == "1":
        pytest.fail(f"{src} is missing (RAGLINE_REQUIRE_DATA=1)")
    else:
        pages = sorted((ROOT / "tests" / "fixtures" / "react").glob("*.md"))
    for p in pages:
        shutil.copy(p, out / p.name)
    return out


def ragline_commands():
    """The `ragline` commands to compare with: the package's console script, and the cargo
    binary when RAGLINE_BIN names it."""
    cmds = [[shutil.which("ragline") or sys.exit("the ragline console script is not installed")]]
    if os.environ.get("RAGLINE_BIN"):
        cmds.append([os.environ["RAGLINE_BIN"]])
    return cmds


def run_cli(cmd, *args, check=True, cwd=None):
    p = subprocess.run([*cmd, *args], capture_output=True, text=True, cwd=cwd)
    if check and p.returncode != 0:
        raise AssertionError(f"{cmd} {args} exited {p.returncode}: {p.stderr}")
    return p


def cli_json(cmd, *args, cwd=None):
    return json.loads(run_cli(cmd, *args, cwd=cwd).stdout)
