"""Result records: a versioned schema and an atomic, never-overwriting store."""

from .schema import SCHEMA_VERSION, new_record  # noqa: F401
from .store import RecordWriter, load_record, write_csv  # noqa: F401
