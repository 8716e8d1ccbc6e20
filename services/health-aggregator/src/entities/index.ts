import { defineEntity, p } from "@mikro-orm/core";

/**
 * One stored log line (spec doc 1 section 2.6). Written in batches and read with plain SQL by
 * the log store (`domain/log-store.ts`); the generated `message_tsv` column (full-text search)
 * is not mapped.
 */
export const LogLineSchema = defineEntity({
  name: "LogLine",
  tableName: "log_lines",
  properties: {
    id: p.bigint().primary().autoincrement(),
    /** The line's identity: the shipper's id, or one derived from its stream position. Unique. */
    lineId: p.uuid().unique(),
    ts: p.datetime(),
    source: p.text(),
    level: p.text(),
    appName: p.text().nullable(),
    branch: p.text().nullable(),
    /** The group owning the app: who may read the line; null for platform lines (operators only). */
    groupSlug: p.text().nullable(),
    serviceName: p.text().nullable(),
    deploymentId: p.text().nullable(),
    buildId: p.text().nullable(),
    actionId: p.text().nullable(),
    instanceId: p.text().nullable(),
    message: p.text(),
    metadata: p.json<Record<string, unknown>>(),
  },
});
export class LogLine extends LogLineSchema.class {}
LogLineSchema.setClass(LogLine);

/**
 * A build as its shipped lines tell of it (first and last line): `source=build` reads the lines
 * of the most recent builds (spec doc 1 section 4.6) without reading apps-builds' builds table.
 * Kept by ingestion.
 */
export const LogBuildSchema = defineEntity({
  name: "LogBuild",
  tableName: "log_builds",
  properties: {
    buildId: p.text().primary(),
    appName: p.text().nullable(),
    groupSlug: p.text().nullable(),
    firstTs: p.datetime(),
    lastTs: p.datetime(),
  },
});
export class LogBuild extends LogBuildSchema.class {}
LogBuildSchema.setClass(LogBuild);

/**
 * A log group: an app, branch and service that container lines were ever stored for (spec doc 1
 * section 4.6, the `reason` of an empty container answer). Kept by ingestion.
 */
export const LogGroupSchema = defineEntity({
  name: "LogGroup",
  tableName: "log_groups",
  properties: {
    id: p.bigint().primary().autoincrement(),
    appName: p.text(),
    branch: p.text().nullable(),
    serviceName: p.text().nullable(),
    /** The group owning the app, as its latest container lines say: who may learn the group exists. */
    groupSlug: p.text().nullable(),
    firstSeen: p.datetime(),
    lastSeen: p.datetime(),
  },
});
export class LogGroup extends LogGroupSchema.class {}
LogGroupSchema.setClass(LogGroup);

export const entities = [LogLineSchema, LogBuildSchema, LogGroupSchema];
