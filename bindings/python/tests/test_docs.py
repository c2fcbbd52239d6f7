"""The Python examples of the README and of docs/python.md, run as written, with this test's
redis-server in place of the documented address. The files are read at test time, so an edit
that breaks an example fails here."""

import contextlib
import io
import re

import pytest

from servers import ROOT

DOCUMENTED_REDIS = "redis://127.0.0.1:6379"


def python_blocks(path: str) -> list:
    return re.findall(r"```python\n(.*?)```", (ROOT / path).read_text(), re.S)


def run(block: str, redis_url: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block.replace(DOCUMENTED_REDIS, redis_url), "<doc>", "exec"), {"__name__": "doc_example"})
    return out.getvalue()


def test_the_readme_example_prints_what_it_says(redis_server):
    [block] = python_blocks("README.md")
    redis_server.client().flushall()
    assert run(block, redis_server.url) == "True 4 None\n"


@pytest.mark.parametrize("index", range(len(python_blocks("docs/python.md"))))
def test_each_example_of_docs_python_md_runs(index, redis_server):
    run(python_blocks("docs/python.md")[index], redis_server.url)


def test_the_first_example_prints_its_decision(redis_server):
    printed = run(python_blocks("docs/python.md")[0], redis_server.url)
    # As shown, to the millisecond that passed between the first admission and the last check.
    shown = r"Decision\(allowed=False, limit=5, remaining=0, retry_after=(10\.0|9\.9\d+), reset_after=(10\.0|9\.9\d+), degraded=None\)\n"
    assert re.fullmatch(shown, printed), printed


def test_the_charge_example_prints_what_it_says(redis_server):
    [block] = [b for b in python_blocks("docs/python.md") if "limiter.charge(" in b]
    assert run(block, redis_server.url) == "350 False 8650\n"
