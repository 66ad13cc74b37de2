// loopback.mjs, preloaded with `node --import`: a server that listens on a bare port (as
// @modelcontextprotocol/server-everything does, on all interfaces) binds 127.0.0.1 instead, since
// test servers listen only on loopback.
import net from 'node:net';

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const port = args[0];
  const bare = typeof port === 'number' || (typeof port === 'string' && /^\d+$/.test(port));
  if (bare && (args.length === 1 || typeof args[1] === 'function')) args.splice(1, 0, '127.0.0.1');
  return listen.apply(this, args);
};
