"""Optional backends: a missing one names the extra to install; the package itself needs only fsspec."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


@pytest.mark.parametrize(("uri", "extra"), [("s3://bucket/run", "s3"), ("gs://bucket/run", "gcs")])
def test_missing_backend_names_the_extra(uri: str, extra: str) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["s3fs"] = None  # as if not installed
        sys.modules["gcsfs"] = None
        from elastrain.durable import CheckpointStore
        try:
            CheckpointStore({uri!r})
        except ImportError as error:
            print(error)
        else:
            raise SystemExit("no ImportError")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert f"pip install 'elastrain-durable[{extra}]'" in done.stdout


def test_arrow_client_without_pyarrow_names_the_extra() -> None:
    script = textwrap.dedent(
        """
        import sys
        sys.modules["pyarrow"] = None  # as if not installed
        from elastrain.durable import ArrowSyncClient
        try:
            ArrowSyncClient(object())
        except ImportError as error:
            print(error)
        else:
            raise SystemExit("no ImportError")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert "pip install 'elastrain-durable[arrow]'" in done.stdout


def test_importing_the_package_imports_no_backend_or_ray() -> None:
    heavy = ("s3fs", "gcsfs", "pyarrow", "ray", "torch", "pydantic")
    script = f"import sys, elastrain.durable; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"
