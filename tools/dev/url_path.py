"""Which functions and files a dataset's URL passes through while a reader opens it.

Serves a converted dataset over HTTP on loopback, opens it with ``WindowDataset`` (or any
``--opener``), and records every epishard function called with that URL (or an opened ``Location`` of it) as an
argument (not as an attribute of ``self``), through ``sys.setprofile``: the files crossed,
the calls, and how often the storage options were resolved (``resolve_storage_options``). Works on
any checkout (``--root``), so two revisions can be compared:

    .venv/bin/python tools/dev/url_path.py DATASET [--root CHECKOUT]
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import sys
import threading


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dataset", help="a converted dataset folder (served over HTTP)")
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    sys.path.insert(0, root)
    sys.path.insert(0, os.path.join(root, "tests"))

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a):
            pass

    handler = functools.partial(Quiet, directory=os.path.abspath(args.dataset))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"

    from faultgen import SPEC

    import epishard
    from epishard.stream import WindowDataset

    assert os.path.realpath(epishard.__file__).startswith(os.path.realpath(root)), epishard.__file__

    calls: list[tuple[str, str]] = []
    prefixes = tuple(os.path.join(root, d) + os.sep for d in ("epishard", "stream", "shardwriter", "balance"))

    def holds(value) -> bool:  # the URL itself, or an opened location of it (not an object that keeps it)
        if isinstance(value, str):
            return value.rstrip("/") == url
        return type(value).__name__ == "Location" and getattr(value, "url", None) == url

    def profile(frame, event, _arg):
        if event != "call":
            return
        path = os.path.realpath(frame.f_code.co_filename)
        if not path.startswith(prefixes):
            return
        names = frame.f_code.co_varnames[: frame.f_code.co_argcount + frame.f_code.co_kwonlyargcount]
        if any(holds(frame.f_locals.get(n)) for n in names if n != "self"):
            calls.append((os.path.relpath(path, root), frame.f_code.co_name))

    sys.setprofile(profile)
    try:
        WindowDataset(url, SPEC, seed=0)
    finally:
        sys.setprofile(None)
        httpd.shutdown()
    files = sorted({f for f, _ in calls})
    print(
        f"{len(calls)} calls took the URL, in {len(files)} files; storage options resolved "
        f"{sum(1 for _, n in calls if n == 'resolve_storage_options')} times"
    )
    for f, n in calls:
        print(f"  {f}: {n}")


if __name__ == "__main__":
    main()
