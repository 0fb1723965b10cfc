"""The log in an object store (DESIGN 11): the port through which the log reads and
writes objects, and what stands behind it.

`store.py` is the port: the `ObjectStore` protocol (synchronous, since a partition's
writer is a thread), its `ObjectMeta`, the URL forms (`s3://BUCKET/PREFIX`, and
`memory://NAME/PREFIX` for the in-memory twin) and `Retrying`, which retries what the
store could not answer now with backoff and jitter. `s3.py` is the real implementation
over obstore (S3, and Ceph's RADOS Gateway in the tests); it loads obstore's native
library, so it is imported on its own, not from here. The twin with injected faults
is `streamlog.testing.memstore.MemoryStore`.
"""

from .store import (ObjectMeta, ObjectStore, RetryPolicy, Retrying, StoreURL,
                    parse_url)

__all__ = ["ObjectMeta", "ObjectStore", "RetryPolicy", "Retrying", "StoreURL", "parse_url"]
