// dynalite for the charge-once tests: in memory, tables active at once, bound to
// 127.0.0.1 on a free port. Prints `PORT=<n>` and exits when its stdin closes (the
// test process that started it ended).
const dynalite = require('dynalite');

const server = dynalite({ createTableMs: 0, deleteTableMs: 0, updateTableMs: 0 });
server.listen(0, '127.0.0.1', () => {
  process.stdout.write(`PORT=${server.address().port}\n`);
});
process.stdin.on('data', () => {});
process.stdin.on('end', () => process.exit(0));
process.stdin.resume();
