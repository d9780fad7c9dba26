"""The progress endpoint: training drivers push `ProgressReport`s, the operator writes them to status.

Modules: `server` (aiohttp app factory and the running server), `auth`
(TokenReview authentication, pod-based authorisation), `limits` (body and rate
bounds), `status_patch` (report to status merge patch, pure), `store` (job
reads and status patches), `errors` (the refusals, each carrying its HTTP
answer), `tls` (the operator-managed CA and serving certificate, and the CA
ConfigMap in job namespaces).
"""
