"""Objects that Spark sends to executors, and a clear error where streamlog is missing.

Strategy: Spark pickles the reader, each InputPartition and the writer on the driver
and unpickles them in an executor's Python worker. Pickled plainly, an executor whose
Python cannot import streamlog fails with Python's bare "No module named
'spark_source'" (four times, once per task attempt). So these classes pickle as a call
of a small function carried by value (cloudpickle, which every PySpark worker has),
with their state as bytes inside: the function imports the class's module first, and
when that fails it raises an ImportError that says which Python on which host lacks
streamlog and what to set. Nothing of spark_source or streamlog is needed to run it.
"""

from __future__ import annotations

import copyreg
import pickle


def _make_rebuild():
    # A nested function: cloudpickle carries it by value (it cannot be imported by
    # name), together with nothing but the modules it imports itself.
    def rebuild(module: str, qualname: str, state: bytes):
        import importlib
        import pickle as pickle_module
        import socket
        import sys
        try:
            owner = importlib.import_module(module)
        except ImportError as error:
            raise ImportError(
                f"format('streamlog'): the Python of this Spark executor ({sys.executable} "
                f"on {socket.gethostname()}) cannot import streamlog's Spark connector "
                f"({error}). Install streamlog for that Python, or put the project on the "
                f"executors' path (spark.executorEnv.PYTHONPATH), and point PYSPARK_PYTHON "
                f"at a Python with streamlog's dependencies") from None
        cls = owner
        for part in qualname.split("."):
            cls = getattr(cls, part)
        instance = cls.__new__(cls)
        values = pickle_module.loads(state)
        setstate = getattr(instance, "__setstate__", None)
        if setstate is not None:
            setstate(values)
        else:
            instance.__dict__.update(values)
        return instance
    return rebuild


class _Call:
    """Pickles as `function(*args)`: what cloudpickle carries inside the payload."""

    def __init__(self, function, args) -> None:
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args


class ShipsToExecutors:
    """Mixin: pickle as a self-checking rebuild (see the module docstring)."""

    def __reduce__(self):
        from pyspark import cloudpickle
        cls = type(self)
        state = getattr(self, "__getstate__", lambda: self.__dict__)()
        if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
            # A subclass no executor can import by name (a job's own, in its script):
            # pickled as usual, cloudpickle carrying the class by value.
            return copyreg.__newobj__, (cls,), state
        payload = cloudpickle.dumps(_Call(_make_rebuild(), (
            cls.__module__, cls.__qualname__,
            pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))))
        return pickle.loads, (payload,)
