"""What Spark pickles for executors: it must come back whole where streamlog is
installed, and fail with a message that says what to install where it is not."""

from __future__ import annotations

import pickle
import subprocess
import sys

from pyspark import cloudpickle

from spark_sink._writer import StreamWriter
from spark_source._options import parse_source_options
from spark_source._plan import OffsetRange
from spark_source._schema import spark_schema
from spark_source._stream import StreamReader

# An executor without streamlog: the connector's modules cannot be imported.
NO_STREAMLOG = """
import pickle, sys
for name in ("spark_source", "spark_sink", "streamlog"):
    sys.modules[name] = None
try:
    pickle.loads(sys.stdin.buffer.read())
except ImportError as error:
    print(error)
"""


def test_executor_objects_round_trip_and_explain_a_missing_streamlog(tmp_path):
    split = OffsetRange("/data/log", "s", 1, 5, 9, False, True, False)
    options = parse_source_options({"path": "/data/log", "stream": "s"}, streaming=True)
    reader = StreamReader(options, spark_schema(False))
    writer = StreamWriter({"path": str(tmp_path / "out"), "stream": "out"},
                          spark_schema(False), False)
    for obj in (split, reader, writer):
        for dumps in (pickle.dumps, cloudpickle.dumps):  # Spark uses both
            copy = pickle.loads(dumps(obj))
            assert type(copy) is type(obj)
            assert copy.__dict__.keys() == obj.__dict__.keys()
    assert pickle.loads(pickle.dumps(split)) == split
    assert pickle.loads(cloudpickle.dumps(reader)).options == options
    assert pickle.loads(pickle.dumps(writer)).options == writer.options
    for obj in (split, reader, writer):
        result = subprocess.run([sys.executable, "-c", NO_STREAMLOG],
                                input=cloudpickle.dumps(obj), capture_output=True, check=True)
        message = result.stdout.decode()
        assert "this Spark executor" in message and sys.executable in message, message
        assert "spark.executorEnv.PYTHONPATH" in message and "PYSPARK_PYTHON" in message


def test_a_subclass_defined_in_a_function_still_ships(tmp_path):
    """A job's own subclass (a class in a function, or in its __main__) cannot be
    imported by name on an executor: it travels by value, as Spark pickles it."""
    class Custom(StreamWriter):
        marker = "custom"

    writer = Custom({"path": str(tmp_path / "out"), "stream": "out"}, spark_schema(False),
                    False)
    copy = pickle.loads(cloudpickle.dumps(writer))
    assert copy.marker == "custom" and copy.options == writer.options
    assert type(copy).__name__ == "Custom"
