"""Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`).

kubectl's typed commands (create, run, expose, auth can-i, drain, ...) send objects
as protobuf and give up on a 415, so the API server decodes them here into the same
JSON-shaped dicts every other code path handles. Request handlers call
`is_protobuf(content_type)` and then `decode(body)`.

The field table comes from a build step (`python -m
socialweb_computer.apiserver.protobuf.build`) that reads Debian's packaging of the
upstream `.proto` files; see `build.py` for how, and `decoder.py` for the JSON rules
and what happens to fields the table does not know.
"""

from socialweb_computer.apiserver.protobuf.decoder import (
    PROTOBUF,
    Decoded,
    UnknownField,
    decode,
    decode_report,
    is_protobuf,
)
from socialweb_computer.apiserver.protobuf.table import TableMissingError


def check_table() -> str:
    """Loads the field table (for start-up checks); returns its Kubernetes version.

    Raises TableMissingError with the command to run when the build step has not run.
    """
    from socialweb_computer.apiserver.protobuf import table

    return table.load().kubernetes_version


__all__ = ["PROTOBUF", "Decoded", "TableMissingError", "UnknownField", "check_table", "decode",
           "decode_report", "is_protobuf"]
