"""The live dashboard: `hil dashboard RUN_DIR|SCENARIO` and `hil run ... --dashboard [HOST:]PORT`.

A web page that a second person watches while the PLC engineer works: live plots of the
plant's default panels (plants/panels.py) and of chosen signals with setpoints and limits,
the loop's lateness histogram and overruns, active alarms, the safety mode and the source of
each applied action, and, after login, the operator actions the safety process accepts.

It never loads the loop: it runs in its own process and reads the process image (shared
memory, seqlock copies the loop never waits for), the run's status snapshot file and the
safety process's status file and decision log (hil/dashboard/sampler.py), at a bounded rate
(default 10 frames/s, at most 50).

Why Starlette + uvicorn + websockets + uPlot: a 10-50 Hz stream of a few hundred to two
thousand floats needs a push channel and a chart that redraws a full buffer in well under a
frame. Starlette is a small, maintained ASGI toolkit (the base of FastAPI) whose websocket
route is a few lines; uvicorn with the `websockets` library (already a dependency of the
OPC UA stack's ecosystem) serves it. uPlot (MIT, ~50 kB, vendored in static/ from npm
uplot 1.6.32: the machine running hil may have no internet) draws 10^5 points per frame in
a few ms, where Bokeh/Panel server round trips (a Python-side document model per client,
diffed per update) cost milliseconds of the dashboard's CPU per client per frame. Heat maps
and bars are plain canvas. No build step, no CDN.

Modules: layout (panels -> series, setpoints, limits), sampler (frames from image and
files), auth (password, sessions, CSRF), app (routes, websocket hub), serve (bind, run),
launch (the process beside `hil run`).
"""
