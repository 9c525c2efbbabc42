#!/usr/bin/env node
// node-opcua client used by tests/integration/test_opcua_node.py: an OPC UA stack we did
// not write, talking to hil's server.
//
//   node tests/node/client.js '<json request>'
//
// Request: { "url": "opc.tcp://127.0.0.1:4840/hil",
//            "security": { "mode": "None" | "Sign" | "SignAndEncrypt",
//                          "policy": "None" | "Basic256Sha256",
//                          "cert": "client_cert.pem", "key": "client_key.pem",
//                          "pki": "<dir>", "trust": ["server_cert.der" (DER), ...],
//                          "autoAccept": false },
//            "user": { "name": "...", "password": "..." } | absent (anonymous),
//            "timeoutMs": 20000,
//            "actions": [ ... ] }
// Actions (run in order in one session; each gives one entry of "results"):
//   { "op": "browse", "namespaceUri": "urn:hil:x", "scenario": "x" }
//       -> { folders: { Sensors: [ node ], ... } } ; node = { name, nodeId, dataType,
//          accessLevel, userAccessLevel, value, statusCode, sourceTimestamp, description,
//          euRange: {low, high} | null, engineeringUnits: {unitId, displayName,
//          description, namespaceUri} | null }
//   { "op": "read", "nodeIds": [...] } -> { values: [ {value, dataType, statusCode,
//          sourceTimestamp, serverTimestamp} ] }
//   { "op": "write", "nodeId": "...", "dataType": "Double", "value": 1.0 }
//       -> { statusCode: "Good" | "BadOutOfRange" ... }   (dataType: the Variant's type,
//          e.g. "Float", "Int32", "Boolean": sent as given, no conversion by node-opcua)
//   { "op": "translate", "namespaceUri": "urn:hil:x", "path": ["x", "Sensors", "glucose"] }
//       -> { statusCode, nodeId, displayName } : TranslateBrowsePathsToNodeIds from
//          Objects along browse names in that namespace
//   { "op": "subscribe", "nodeIds": [...], "publishingInterval": 10, "samplingInterval": 10,
//     "queueSize": 100, "durationMs": 1500 }
//       -> { revisedPublishingInterval, notifications: { nodeId: [ {value, sourceTimestamp,
//          receivedMs} ] } }
// Output: one JSON object on stdout, { ok, securityMode, securityPolicy, results } or
// { ok: false, error }. Exit code 0 when ok, 1 otherwise.
"use strict";

const fs = require("fs");
const path = require("path");
const os = require("os");
const opcua = require("node-opcua");

const {
  OPCUAClient, MessageSecurityMode, SecurityPolicy, AttributeIds, DataType, NodeClass,
  ClientSubscription, ClientMonitoredItem, TimestampsToReturn, OPCUACertificateManager,
  UserTokenType, BrowseDirection, makeBrowsePath,
} = opcua;

function fail(err) {
  process.stdout.write(JSON.stringify({ ok: false, error: String(err && err.message ? err.message : err) }) + "\n");
  process.exit(1);
}

function dataTypeName(dv) {
  if (!dv || !dv.value) return null;
  return DataType[dv.value.dataType];
}

function plain(v) {
  if (v === null || v === undefined) return null;
  if (typeof v === "bigint") return Number(v);
  if (Array.isArray(v) && v.length === 2 && typeof v[0] === "number") {
    // node-opcua (U)Int64 as [high, low]
    return v[0] * 4294967296 + v[1];
  }
  if (typeof v === "number" && !Number.isFinite(v)) return String(v);
  return v;
}

function iso(d) {
  return d ? new Date(d).toISOString() : null;
}

async function readNode(session, nodeId) {
  const attrs = [AttributeIds.Value, AttributeIds.DataType, AttributeIds.AccessLevel,
    AttributeIds.UserAccessLevel, AttributeIds.Description, AttributeIds.BrowseName];
  const dvs = await session.read(attrs.map((attributeId) => ({ nodeId, attributeId })));
  const [val, dtype, al, ual, desc, bname] = dvs;
  const out = {
    name: bname.value.value ? bname.value.value.name : null,
    nodeId: nodeId.toString(),
    dataType: dtype.value.value ? DataType[dtype.value.value.value] || dtype.value.value.toString() : null,
    accessLevel: al.value.value,
    userAccessLevel: ual.value.value,
    description: desc.value.value ? desc.value.value.text : null,
    value: plain(val.value ? val.value.value : null),
    statusCode: val.statusCode.name,
    sourceTimestamp: iso(val.sourceTimestamp),
    euRange: null,
    engineeringUnits: null,
  };
  const props = await session.translateBrowsePath([
    makeBrowsePath(nodeId, "/0:EURange"), makeBrowsePath(nodeId, "/0:EngineeringUnits"),
  ]);
  const ids = props.map((r) => (r.statusCode.isGood() ? r.targets[0].targetId : null));
  if (ids[0]) {
    const r = (await session.read({ nodeId: ids[0], attributeId: AttributeIds.Value })).value.value;
    out.euRange = { low: r.low, high: r.high };
  }
  if (ids[1]) {
    const eu = (await session.read({ nodeId: ids[1], attributeId: AttributeIds.Value })).value.value;
    out.engineeringUnits = {
      unitId: eu.unitId, namespaceUri: eu.namespaceUri,
      displayName: eu.displayName ? eu.displayName.text : null,
      description: eu.description ? eu.description.text : null,
    };
  }
  return out;
}

async function children(session, nodeId) {
  const res = await session.browse({
    nodeId, browseDirection: BrowseDirection.Forward, includeSubtypes: true,
    referenceTypeId: "HierarchicalReferences", resultMask: 63,
  });
  if (!res.statusCode.isGood()) throw new Error(`browse ${nodeId}: ${res.statusCode.name}`);
  return res.references.map((r) => ({ name: r.browseName.name, nodeId: r.nodeId, nodeClass: r.nodeClass }));
}

async function browse(session, action) {
  const nsArray = (await session.read({ nodeId: "ns=0;i=2255", attributeId: AttributeIds.Value })).value.value;
  const ns = nsArray.indexOf(action.namespaceUri);
  if (ns < 0) throw new Error(`namespace ${action.namespaceUri} not in ${nsArray}`);
  const objects = await children(session, "ns=0;i=85");
  const root = objects.find((c) => c.name === action.scenario);
  if (!root) throw new Error(`no ${action.scenario} under Objects (${objects.map((c) => c.name)})`);
  const folders = {};
  for (const f of await children(session, root.nodeId)) {
    folders[f.name] = [];
    for (const v of await children(session, f.nodeId)) {
      if (v.nodeClass !== NodeClass.Variable) continue;
      folders[f.name].push(await readNode(session, v.nodeId));
    }
  }
  return { namespaceIndex: ns, folders };
}

async function read(session, action) {
  const dvs = await session.read(action.nodeIds.map((nodeId) => ({ nodeId, attributeId: AttributeIds.Value })));
  return {
    values: dvs.map((dv) => ({
      value: plain(dv.value ? dv.value.value : null), dataType: dataTypeName(dv),
      statusCode: dv.statusCode.name, sourceTimestamp: iso(dv.sourceTimestamp),
      serverTimestamp: iso(dv.serverTimestamp),
    })),
  };
}

async function write(session, action) {
  const status = await session.write({
    nodeId: action.nodeId, attributeId: AttributeIds.Value,
    value: { value: { dataType: DataType[action.dataType], value: action.value } },
  });
  return { statusCode: status.name };
}

async function subscribe(session, action) {
  const sub = ClientSubscription.create(session, {
    requestedPublishingInterval: action.publishingInterval ?? 10,
    requestedLifetimeCount: 1000, requestedMaxKeepAliveCount: 20,
    maxNotificationsPerPublish: 0, publishingEnabled: true, priority: 10,
  });
  await new Promise((resolve, reject) => {
    sub.once("started", resolve);
    sub.once("internal_error", reject);
  });
  const t0 = Date.now();
  const notifications = {};
  for (const nodeId of action.nodeIds) {
    notifications[nodeId] = [];
    const item = ClientMonitoredItem.create(sub, { nodeId, attributeId: AttributeIds.Value }, {
      samplingInterval: action.samplingInterval ?? 10, discardOldest: true, queueSize: action.queueSize ?? 100,
    }, TimestampsToReturn.Both);
    item.on("changed", (dv) => {
      notifications[nodeId].push({
        value: plain(dv.value ? dv.value.value : null), statusCode: dv.statusCode.name,
        sourceTimestamp: iso(dv.sourceTimestamp), receivedMs: Date.now() - t0,
      });
    });
  }
  if (action.readyFile) fs.writeFileSync(action.readyFile, "subscribed\n");
  await new Promise((r) => setTimeout(r, action.durationMs ?? 1000));
  const revised = sub.publishingInterval;
  await sub.terminate();
  return { revisedPublishingInterval: revised, notifications };
}

async function translate(session, action) {
  const nsArray = (await session.read({ nodeId: "ns=0;i=2255", attributeId: AttributeIds.Value })).value.value;
  const ns = nsArray.indexOf(action.namespaceUri);
  if (ns < 0) throw new Error(`namespace ${action.namespaceUri} not in ${nsArray}`);
  const relative = action.path.map((name) => `/${ns}:${name}`).join("");
  const [res] = await session.translateBrowsePath([makeBrowsePath("ns=0;i=85", relative)]);
  if (!res.statusCode.isGood()) return { statusCode: res.statusCode.name, nodeId: null, displayName: null };
  const nodeId = res.targets[0].targetId.toString();
  const dn = await session.read({ nodeId, attributeId: AttributeIds.DisplayName });
  return { statusCode: res.statusCode.name, nodeId, displayName: dn.value.value ? dn.value.value.text : null };
}

const OPS = { browse, read, write, subscribe, translate };

async function main() {
  const req = JSON.parse(process.argv[2] || "{}");
  const sec = req.security || {};
  const mode = MessageSecurityMode[sec.mode || "None"];
  const policy = SecurityPolicy[sec.policy || "None"];
  if (mode === undefined || policy === undefined) throw new Error(`unknown security ${sec.mode}/${sec.policy}`);
  const pki = sec.pki || fs.mkdtempSync(path.join(os.tmpdir(), "hil-node-pki-"));
  const manager = new OPCUACertificateManager({
    rootFolder: pki, automaticallyAcceptUnknownCertificate: !!sec.autoAccept, disableFileWatchers: true,
  });
  await manager.initialize();
  for (const file of sec.trust || []) {
    await manager.trustCertificate(fs.readFileSync(file));  // DER
  }
  const options = {
    applicationName: "hil node-opcua test client",
    applicationUri: sec.applicationUri || "urn:hil:opcua:client",
    securityMode: mode, securityPolicy: policy, endpointMustExist: false,
    connectionStrategy: { maxRetry: 0, initialDelay: 100, maxDelay: 200 },
    clientCertificateManager: manager, requestedSessionTimeout: 60000,
  };
  if (sec.cert) options.certificateFile = sec.cert;
  if (sec.key) options.privateKeyFile = sec.key;
  const client = OPCUAClient.create(options);
  const timer = setTimeout(() => fail(new Error(`timed out after ${req.timeoutMs || 20000} ms`)), req.timeoutMs || 20000);
  await client.connect(req.url);
  let session;
  try {
    const identity = req.user
      ? { type: UserTokenType.UserName, userName: req.user.name, password: req.user.password }
      : { type: UserTokenType.Anonymous };
    session = await client.createSession(identity);
    const results = [];
    for (const action of req.actions || []) {
      const op = OPS[action.op];
      if (!op) throw new Error(`unknown op ${action.op}`);
      results.push(await op(session, action));
    }
    process.stdout.write(JSON.stringify({
      ok: true, securityMode: MessageSecurityMode[client.securityMode],
      securityPolicy: client.securityPolicy, results,
    }) + "\n");
  } finally {
    clearTimeout(timer);
    if (session) await session.close().catch(() => {});
    await client.disconnect().catch(() => {});
    await manager.dispose().catch(() => {});
  }
}

main().then(() => process.exit(0)).catch(fail);
