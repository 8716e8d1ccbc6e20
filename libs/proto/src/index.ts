export * from "./gen/platform/common/v1/common_pb.ts";
export * from "./gen/platform/identity/v1/identity_pb.ts";
export * from "./gen/platform/apps_builds/v1/apps_builds_pb.ts";
export * from "./gen/platform/deploy_queue/v1/deploy_queue_pb.ts";
export * from "./gen/platform/domains_dns/v1/domains_dns_pb.ts";
export * from "./gen/platform/mailer/v1/mailer_pb.ts";
export * from "./gen/platform/storage/v1/storage_pb.ts";
export * from "./gen/platform/hooks/v1/hooks_pb.ts";
export * from "./gen/platform/health_aggregator/v1/health_aggregator_pb.ts";

/**
 * The fields of `RegisterAppRequest.settings`, a JSON value read by the rules of an app update:
 * the gateway forwards exactly these of a register body, and apps-builds accepts exactly these.
 */
export const REGISTRATION_SETTINGS = ["deploy_config", "services", "containers", "database_enabled", "cache_enabled", "email_enabled"] as const;
