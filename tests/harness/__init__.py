"""streamlog's own test harnesses, kept out of the installed package.

`damage.py` damages a built log one fault at a time and judges every answer
(tests/sim/test_damage_sweep.py, bench/integrity_sweep.py); `sim.py` simulates one
partition's whole life from a seed (tests/sim/test_partition_sim.py). The test doubles
users' own tests need (`faultfs`, `memindex`, `clock`, `serve`) stay in
`streamlog.testing`; these modules use them, never the other way round.

Imported as `harness.damage` and `harness.sim`, with tests/ on sys.path: pytest puts it
there (tests/conftest.py, in its default import mode), bench/integrity_sweep.py adds it.
"""
