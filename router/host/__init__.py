"""``acp-router host``: an existing stdio ACP agent as a fleet backend.

Design:

* **One agent process for all clients.** The host starts the command once and
  every WebSocket client at ``/acp`` (editors, a router's per-client links, a
  router's control link) shares that process. A session therefore stays in memory
  when its client disconnects, and a client that reconnects (to this host, or
  through any router replica) resumes it on the same process.
* **Ids** (:mod:`.multiplex`): client requests get host-assigned ids at the agent and
  their own ids back; agent requests keep the agent's ids and are answered only by
  the client they went to; the host's own ``initialize`` has a string id.
* **Sessions** (:mod:`.owners`) belong to the client that last created, loaded, resumed
  or forked them; the agent's notifications and requests for a session go to that
  client.
* **initialize** is the host's: it initializes the agent once per process (with
  ``--client-capabilities``, default none, so the agent uses its own file system and
  terminals) and answers every client with the agent's result plus
  ``sessionCapabilities.status`` and ``_meta.instanceId``, a nonce new for each agent
  process (so a router tells the agent's restart from a flap).
* **Clients never make the host wait**: each has a bounded outbox and one writer task
  (:mod:`.client_link`); one whose outbox overflows is closed with 1008.
* **session/status** is asked of the agent when it advertises the method (its
  dialect, e.g. ``open``/``saved``, is translated to the RFD's values); otherwise the
  host answers from what it saw: ``active`` from a successful new/load/resume/fork
  until close/archive/delete, ``inactive`` after a close when the agent can load or
  resume, ``-32002`` otherwise.
* **The agent's own words**: its stderr flows to the host's, and its last lines
  (:mod:`.stderr`) go in ``data.agentStderr`` of an error it answers to
  ``session/new``, ``load``, ``resume`` or ``fork``, and of the ``-32013`` answers
  owed when it dies.
* **Agent exit**: clients are disconnected, unanswered requests get ``-32013``, the
  session table is emptied (``-32002``), and the command is started again with
  backoff; a router in front places those sessions again by its rules.
* **Stopping**: the agent runs in a process group of its own; SIGTERM to the host
  closes its stdin and sends the group SIGTERM, then SIGKILL, so nothing it started
  outlives it.

:mod:`.multiplex`, :mod:`.owners` and :mod:`.stderr` are the sans-I/O bookkeeping,
:mod:`.process` the subprocess, :mod:`.client_link` a client's outbox and writer,
:mod:`.server` the aiohttp shell.
"""
