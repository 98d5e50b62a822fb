"""The epishard format: the contract the writer, the reader and balancing share.

What a converted dataset is on disk, and how to open it safely: the writer (``epishard.shardwriter``)
produces it, the reader (``epishard.stream``) and balancing (``epishard.balance``) consume it, and
all three import it from here. This package imports none of them.

Modules, from the bottom layer up (each imports only those above it in this list):

- ``errors``: ``FormatError`` (a file breaks the format), ``VideoError`` (no frame stream in a
  video), ``check_choice`` and the error-policy vocabulary (``ErrorPolicy``);
- ``untrusted``: metadata from outside read within bounds (``loads``, ``check_size``) and text
  made safe for a terminal (``printable``);
- ``retry``: the time budget of retried remote calls;
- ``verified``: per-node stamps of files whose sha256 was checked;
- ``stats``: per-feature statistics (``numeric_matrix``, ``DatasetStats``);
- ``manifest``: format names and constants (file, member and shard names, the index's Arrow
  schema, the format version), the typed manifest (``Manifest``) and the checks of its fields;
- ``validate``: the checks of a window index against its manifest (``check_index``, ...);
- ``index``: ``WindowIndex``, the window index in memory;
- ``storage``: local folders and fsspec URLs (``Storage``, ``FileSystemHandle``, storage options);
- ``opening``: an index opened against its manifest (``load_dataset_index``,
  ``load_shard_indexes``), and ``NotConverted`` for a LeRobot dataset given in place of a converted one;
- ``decoder``: the decoder glue (``frame_stream``, ``open_decoder``, ``container_frames``).

Importing this package loads none of them; ``decoder`` loads PyAV, and torchcodec only when a
decoder is opened.
"""

__all__: list[str] = []
