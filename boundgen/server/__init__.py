"""`boundgen serve`: a core, two wings and the process that joins them. Imports go only downward
(tests/test_layers.py):

    deploy/   deployment topologies: front-end processes around one engine process (frontends,
       |      frontend, link, engine_host, linked_engine), replicas over gRPC (replicas,
       |      replica_engine), Ray Serve (ray_serve, ray_replica, ray_proxy), the process launcher
       v      (launch)
    app.py    the serving process: loads the engines into the core's ModelSet and binds kserve/'s
       |      HTTP and gRPC listeners to it (lifecycle: listen, load, ready, drain, stop)
       v
    kserve/   KServe v2 / Open Inference Protocol: HTTP (http_api, http_messages), gRPC (grpc_api,
       |      grpc_messages, pb built from ../kserve.proto), wire tensors (tensors) and what they
       |      mean to the core (inference: tensors -> EngineCall, result -> tensors), shared memory,
       |      Triton's extensions, the model repository; it also mounts the core's JSON routes on
       v      its HTTP app
    core      admission, served models (served, models), signature (a model's inputs, outputs and
              checks; the engine call), metrics, config, auth, logs, status, request ids, HTTP
              bodies (their inflation, their JSON value budgets, a JSON worker process for large
              ones) and connections, and the JSON routes (score_api, beam_api, rerank_api); it
              speaks EngineCalls and results (ModelSet.run), never KServe tensors

app.py owns the wiring because it is the one place that needs both the core's models and the
protocols: the core stays protocol-free, kserve/ never learns how it is hosted, and deploy/
builds topologies out of app.py's Server. launch.py and ray_proxy.py here are old import paths
of deploy/'s modules, kept for users' code and cluster settings; nothing in boundgen imports them.
"""
