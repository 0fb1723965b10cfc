"""The daemon's web console (`streamlog serve LOG --console-port C`): the log's streams,
a message browser that seeks by offset and by event time, the live tail, consumer
groups' lag, operator jobs and the log's recovery, and (with --console-write) writes.

Where the parts are: sign-in and its rate limit, sans-I/O (auth.py); how bytes and
times are shown, pure (render.py); what each page shows, read from the log on a thread
pool (data.py); the web layer, its routes, pages and live tail (app.py, templates/,
static/); the process it runs in, beside the daemon's (worker.py), and what it asks the
daemon for (daemon.py).
"""
