/**
 * Imported first by every process entry, before application code allocates anything.
 *
 * V8 "pretenures" an allocation site whose objects survived a young-generation collection, and
 * from then on allocates its objects straight in the old generation. Our processes build many
 * long-lived objects at start (routes, schemas, clients) from the same sites that later allocate
 * per-request objects (Fastify's, Connect's, pg's), so those became old-generation garbage: the
 * gateway spent a sixth of its time in 14 ms scavenges and mark-compacts every second, a third of
 * its throughput. Without pretenuring, per-request garbage dies young, as it should.
 */
import v8 from "node:v8";

v8.setFlagsFromString("--no-allocation-site-pretenuring");
