"""Serving over HTTP (lesson 11): the engine behind OpenAI's API, as vLLM and SGLang serve a model.

* :mod:`~paged_edu.serve.protocol` -- the API's request bodies, their checks, the JSON answered;
* :mod:`~paged_edu.serve.tokenizer` -- text in and out: a byte tokenizer, chat templates, streamed
  detokenization with stop strings;
* :mod:`~paged_edu.serve.core` -- the engine core: the engine in a process of its own, requests joining
  and leaving between steps, one message per step back;
* :mod:`~paged_edu.serve.client` -- the API server's end of the core: its process, its sockets, each
  request's stream of tokens;
* :mod:`~paged_edu.serve.metrics` -- ``/metrics`` under vLLM's Prometheus names;
* :mod:`~paged_edu.serve.kv_events` -- the prefix cache's changes in vLLM's KV-event wire format;
* :mod:`~paged_edu.serve.app` -- the routes (FastAPI);
* :mod:`~paged_edu.serve.launch` -- ``paged-edu serve``: model, engine (core), app, uvicorn;
* :mod:`~paged_edu.serve.api_servers` -- ``--api-server-count N``: N API server processes on one port and one core;
* :mod:`~paged_edu.serve.bench` -- ``paged-edu bench-serve``: a client that measures any such server;
* :mod:`~paged_edu.serve.traffic` -- the course's workloads as the requests the client sends;
* :mod:`~paged_edu.serve.process` -- ``paged-edu serve`` as a child process on a free port, stopped with its parent;
* :mod:`~paged_edu.serve.flags` -- both commands' flags (argparse only).

Below: the engine, the models and :mod:`paged_edu.core`. Above: the lessons' labs that start a server and read it.
The server stack (FastAPI, uvicorn, prometheus_client, pyzmq, msgpack; httpx and aiohttp for the clients) is the
``serve`` extra.
"""
