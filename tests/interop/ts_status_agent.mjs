#!/usr/bin/env node
// A stdio ACP agent built on the official TypeScript SDK (@agentclientprotocol/sdk), using
// its unstable entrypoint for `session/status`, which answers in the SDK's dialect:
// "open" (in memory), "saved" (closed, can be loaded or resumed again), or -32002.
// Every reply names the process ("[pid 42] hello") so tests can tell processes apart.
import { randomUUID } from "node:crypto";
import { Readable, Writable } from "node:stream";

import * as acp from "@agentclientprotocol/sdk/unstable";

const tag = `[pid ${process.pid}]`;
const open = new Map(); // sessionId -> texts said
const saved = new Map(); // closed sessions, still restorable

function inMemory(sessionId) {
  const history = open.get(sessionId);
  if (history === undefined) throw acp.RequestError.resourceNotFound(sessionId);
  return history;
}

function restore(sessionId) {
  if (saved.has(sessionId)) {
    open.set(sessionId, saved.get(sessionId));
    saved.delete(sessionId);
  }
  return inMemory(sessionId);
}

function say(client, sessionId, text) {
  return client.notify(acp.methods.client.session.update, {
    sessionId,
    update: { sessionUpdate: "agent_message_chunk", content: { type: "text", text } },
  });
}

acp
  .agent({ name: "ts-status-agent" })
  .onRequest(acp.methods.agent.initialize, () => ({
    protocolVersion: acp.PROTOCOL_VERSION,
    agentCapabilities: {
      loadSession: true,
      sessionCapabilities: { resume: {}, close: {}, status: {} },
    },
    agentInfo: { name: "ts-status-agent", version: "0.0.1" },
  }))
  .onRequest(acp.methods.agent.session.new, () => {
    const sessionId = `sess_${randomUUID()}`;
    open.set(sessionId, []);
    return { sessionId };
  })
  .onRequest(acp.methods.agent.session.resume, ({ params }) => {
    restore(params.sessionId);
    return {};
  })
  .onRequest(acp.methods.agent.session.load, async ({ params, client }) => {
    for (const text of restore(params.sessionId)) await say(client, params.sessionId, text);
    return {};
  })
  .onRequest(acp.methods.agent.session.close, ({ params }) => {
    saved.set(params.sessionId, inMemory(params.sessionId));
    open.delete(params.sessionId);
    return {};
  })
  .onRequest(acp.methods.agent.session.status, ({ params }) => {
    if (open.has(params.sessionId)) return { status: "open" };
    if (saved.has(params.sessionId)) return { status: "saved" };
    throw acp.RequestError.resourceNotFound(params.sessionId);
  })
  .onRequest(acp.methods.agent.session.prompt, async ({ params, client }) => {
    const history = inMemory(params.sessionId);
    for (const block of params.prompt) {
      if (block.type !== "text") continue;
      const text = `${tag} ${block.text}`;
      history.push(text);
      await say(client, params.sessionId, text);
    }
    return { stopReason: "end_turn" };
  })
  .onNotification(acp.methods.agent.session.cancel, () => {})
  .connect(acp.ndJsonStream(Writable.toWeb(process.stdout), Readable.toWeb(process.stdin)));
