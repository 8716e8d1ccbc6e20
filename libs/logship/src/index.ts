/**
 * @platform/logship: the log line contract shared by the agents that ship lines and
 * health-aggregator that stores them, and the shipper agents use.
 */
export * from "./line.ts";
export { LogShipper, subjectToken, type AppOfLine, type LogLineInput, type LogShipperOptions, type LogShipperStats } from "./shipper.ts";
