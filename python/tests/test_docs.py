"""The example of docs/python.md runs as written."""
import os
import re
import subprocess
import sys

import pytest

import kvvm

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "python.md")


def test_docs_example_runs():
    pytest.importorskip("torch")
    if not os.path.exists(DOC):
        pytest.skip("docs/python.md is not beside this test tree (installed copy)")
    code = re.search(r"```python\n(.*?)```", open(DOC).read(), re.S).group(1)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(kvvm.__file__)) + os.pathsep + \
        env.get("PYTHONPATH", "")
    env["KVVM_BACKEND"] = "emulated"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    toks = eval(r.stdout.strip().splitlines()[-1])
    assert len(toks) == 13 and toks[:3] == [1, 2, 3]
