"""CREATE TABLE t USING streamlog OPTIONS (path '...', stream '...'), then SELECT.

Strategy: Spark's session catalog hands a Python data source the table's options once,
when the table is created (with the catalog's own properties beside them: location,
owner, provider, option.<name>), and asks it for the schema then; it stores that schema
but, when the table is read later, builds the source with no options at all (only those
of the query itself, SELECT ... WITH (...)). The schema is the one thing that comes
back, with the metadata of its fields intact. So when Spark creates a table (the
options carry `provider`), `remember_options` puts the user's options into the
metadata of the first column, and `table_options` takes them out again at read time,
under any options the query gives itself.
"""

from __future__ import annotations

import json

_METADATA_KEY = "streamlog.table.options"
# The session catalog's own table properties: not options of ours.
_CATALOG_KEYS = ("location", "owner", "provider", "comment", "external",
                 "is_managed_location")


def _is_catalog_table(options: dict) -> bool:
    return str(options.get("provider", "")).lower() == "streamlog"


def remember_options(schema, options):
    """`schema`, with the table's options kept in its first field's metadata when Spark
    is creating a catalog table; else `schema` itself."""
    given = {str(k).lower(): str(v) for k, v in dict(options).items()}
    if not _is_catalog_table(given):
        return schema
    kept = {k: v for k, v in given.items()
            if k not in _CATALOG_KEYS and not k.startswith("option.")}
    from pyspark.sql.types import StructField, StructType
    first, *rest = schema.fields
    metadata = {**(first.metadata or {}), _METADATA_KEY: json.dumps(kept, sort_keys=True)}
    return StructType([StructField(first.name, first.dataType, first.nullable, metadata),
                       *rest])


def table_options(options, schema) -> dict:
    """The options to read with: those a catalog table stored in `schema`, overridden
    by those given now (a stream selection given now replaces the table's)."""
    from ._options import SELECTORS
    given = {str(k).lower(): str(v) for k, v in dict(options).items()}
    stored = {}
    if schema is not None and schema.fields:
        raw = (schema.fields[0].metadata or {}).get(_METADATA_KEY)
        if raw:
            stored = json.loads(raw)
    selectors = {name.lower() for name in SELECTORS}
    if selectors & given.keys():
        stored = {k: v for k, v in stored.items() if k not in selectors}
    return {**stored, **given}
