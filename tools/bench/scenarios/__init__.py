"""The scenarios of ``tools/bench/run.py``: name -> (module in this package, what it measures).

A scenario module has ``options(parser)`` (its own options; the harness adds ``--json``, ``--out``,
``--markdown``, ``--smoke``), ``run(args) -> int``, and ``SMOKE`` (option defaults of ``--smoke``); or
``main(argv)`` when it keeps a command line of its own (``peers``, ``lerobot-default``).
"""

SCENARIOS = {
    "peers": ("peers", "epishard beside LeRobot, Lance, Ray Data, webdataset, naive: samples/s at matched diversity"),
    "reader": ("reader", "the streaming reader against naive per-sample decoding, segments, planning, lookups"),
    "stages": ("stages", "one reader's time per stage and bytes read, packet tables vs whole members; GOP bytes"),
    "reencode": ("reencode", "convert --reencode: PSNR/SSIM against the source, and reading speed vs native"),
    "decode": ("decode", "decoder open and RGB conversion per codec, depth path, GIL contention, swscale resize"),
    "index": ("index", "window index load time and per-sample lookup, 1 vs 27,500 episodes"),
    "plan": ("plan", "planning CPU and memory from 1 to 1,000,000 episodes"),
    "firstbatch": ("firstbatch", "time to the first batch at up to 1,000,000 episodes (index, dataset, batch)"),
    "memory": ("memory", "worker RSS across epochs; the memory budget against the shuffle pool (--budget)"),
    "balance": ("balance", "cost-aware balancing: simulated step times, or DDP end to end (--e2e)"),
    "remote": ("remote", "S3 with latency vs local disk; remote-source conversion; fetch transports (--part)"),
    "multirate": ("multirate", "a 1 kHz stream at its own rate beside a 33-frame video window: its added cost"),
    "writer": ("writer", "conversion: check levels, file size, source formats and their memory"),
    "ray": ("ray", "convert --ray and RayWindowLoader against WindowLoader on a loopback Ray cluster"),
    "cli": ("cli", "the epishard command's start-up: --help and argument errors"),
    "lerobot-default": ("lerobot_default", "generate a dataset with LeRobot 0.6.1's default recording settings"),
}
