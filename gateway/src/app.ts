/**
 * The gateway: the single /api surface. It authenticates, selects the group, checks scope and
 * calls the owning service; it holds no business state.
 */
import { readFileSync } from "node:fs";
import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance, type FastifyReply } from "fastify";
import swagger from "@fastify/swagger";
import { gatewayEnv, loadConfig, type Config } from "@platform/config";
import { createLogger, type Logger } from "@platform/logger";
import { connectBus, parseGroupDeleted, parseGroupRenamed, subjects, subscribe, type Bus } from "@platform/bus";
import { createServiceClient } from "@platform/rpc";
import { AppsBuildsService, HealthAggregatorService, IdentityService } from "@platform/proto";
import { registerAccess } from "./access.ts";
import { CredentialCache } from "./domain/credential-cache.ts";
import { closeBody, refuseBody, refuseUnparsed, refuseUrl, typedBodyValidator } from "./domain/input-bounds.ts";
import { clientErrorHandler, registerErrorHandling } from "./errors.ts";
import { finishDocument, listGatewayAnswers, sharedSchemas } from "./schemas.ts";
import { appRoutes } from "./routes/apps.ts";
import { appSettingsRoutes } from "./routes/app-settings.ts";
import { buildRoutes } from "./routes/builds.ts";
import { authRoutes } from "./routes/auth.ts";
import { docsRoutes } from "./routes/docs.ts";
import { groupRoutes } from "./routes/groups.ts";
import { healthRoutes } from "./routes/health.ts";
import { keyRoutes } from "./routes/keys.ts";
import { queueRoutes } from "./routes/queue.ts";
import { deploymentRoutes } from "./routes/deployments.ts";
import { appLifecycleRoutes } from "./routes/app-lifecycle.ts";
import { DeployQueueService } from "@platform/proto";
import { logRoutes } from "./routes/logs.ts";
import { varRoutes } from "./routes/vars.ts";

export type GatewayConfig = Config<typeof gatewayEnv>;

const VERSION: string = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")).version;

export interface Gateway {
  app: FastifyInstance;
  cache: CredentialCache;
  close(): Promise<void>;
}

export async function build(config: GatewayConfig = loadConfig(gatewayEnv), logger: Logger = createLogger({ service: "gateway", level: config.LOG_LEVEL })): Promise<Gateway> {
  const app = Fastify({
    // Fastify types its logger against its own pino major; ours is API-compatible.
    loggerInstance: logger as unknown as FastifyBaseLogger,
    // Requests are traced; a log line per request would only repeat the span.
    logController: new LogController({ disableRequestLogging: true }),
    bodyLimit: config.BODY_LIMIT_BYTES,
    trustProxy: true,
    // A field a route does not know is refused (422), not silently dropped (see closeBody).
    ajv: { customOptions: { removeAdditional: false } },
    schemaController: { compilersFactory: { buildValidator: typedBodyValidator() } },
    // An id or name past the router's default of 100 characters reaches its route, which says
    // what is wrong with it (422) or that it names nothing (404), as for any other value.
    routerOptions: { ignoreTrailingSlash: true, maxParamLength: 1024 },
    // Every line already carries the request's trace and span ids (the logger's mixin); a child
    // logger per request would only add a request id, at a cost on every request.
    childLoggerFactory: (parent) => parent,
    // A URL that cannot be decoded is refused before routing, where the error handler is not asked.
    frameworkErrors: (err, _request, reply: FastifyReply) => void reply.code(400).send({ detail: `Malformed request: ${err.message}` }),
    clientErrorHandler,
  });
  const identity = createServiceClient(IdentityService, config.IDENTITY_URL, { token: config.PLATFORM_INTERNAL_TOKEN });
  const apps = createServiceClient(AppsBuildsService, config.APPS_BUILDS_URL, { token: config.PLATFORM_INTERNAL_TOKEN });
  const cache = new CredentialCache(config.CREDENTIAL_CACHE_TTL_MS);
  let bus: Bus | null = null;

  // Routes whose body is optional (cancel, undeploy) are called by clients that send a JSON
  // content type with no body at all: that is no body, not a malformed one. A route that needs
  // a body still says so, with the 422 of its schema.
  const parseJson = app.getDefaultJsonParser("error", "error");
  app.removeContentTypeParser("application/json");
  // Every body of this API is JSON: a text body is 415 on every route, not a string some routes take.
  app.removeContentTypeParser("text/plain");
  app.addContentTypeParser("application/json", { parseAs: "string" }, (request, body, done) => {
    if (body === "") return done(null, undefined);
    parseJson(request, body as string, (err, value) => {
      if (err) return done(refuseUnparsed(body as string) ?? err);
      const refused = refuseBody(body as string, value);
      return refused ? done(refused) : done(null, value);
    });
  });
  // A NUL character or a body nested too deep is refused before any service sees it.
  app.addHook("onRequest", async (request) => {
    const refused = refuseUrl(request.raw.url ?? "");
    if (refused) throw refused;
  });

  app.addHook("onRoute", closeBody);
  app.addHook("onRoute", listGatewayAnswers);
  registerErrorHandling(app);
  for (const schema of sharedSchemas) app.addSchema(schema);
  await app.register(swagger, {
    openapi: {
      openapi: "3.1.0",
      info: {
        title: "Platform API",
        version: VERSION,
        description:
          "Control API of the hosting platform. Credentials go in `Authorization: Bearer <credential>` (or the bare credential): " +
          "API keys start with `pf_k1_`, session tokens with `ses_`. Errors are `{detail}`.",
      },
      servers: [{ url: "/" }],
      components: { securitySchemes: { credential: { type: "http", scheme: "bearer", description: "pf_k1_ API key or ses_ session token" } } },
      security: [{ credential: [] }],
    },
    refResolver: { buildLocalReference: (json, _base, _fragment, i) => String(json.$id ?? `def-${i}`) },
    transformObject: (documents) => ("openapiObject" in documents ? finishDocument(documents.openapiObject) : documents.swaggerObject),
  });
  const access = registerAccess(app, { identity, cache, logger });

  healthRoutes(app, { identity, environment: config.PLATFORM_ENVIRONMENT, version: VERSION });
  groupRoutes(app, identity);
  keyRoutes(app, identity, cache);
  authRoutes(app, identity, cache);
  const queue = createServiceClient(DeployQueueService, config.DEPLOY_QUEUE_URL, { token: config.PLATFORM_INTERNAL_TOKEN });
  appRoutes(app, apps, queue, { domain: config.PLATFORM_DOMAIN, environment: config.PLATFORM_ENVIRONMENT });
  appSettingsRoutes(app, apps);
  const health = createServiceClient(HealthAggregatorService, config.HEALTH_AGGREGATOR_URL, { token: config.PLATFORM_INTERNAL_TOKEN });
  buildRoutes(app, apps, queue, health);
  queueRoutes(app, queue);
  deploymentRoutes(app, queue, health);
  appLifecycleRoutes(app, apps, queue);
  logRoutes(app, { health, apps, queue });
  varRoutes(app, apps, { environment: config.PLATFORM_ENVIRONMENT });
  docsRoutes(app);

  // Every replica drops a revoked credential as soon as identity announces it.
  bus = await connectBus({ url: config.NATS_URL, name: "gateway", prefix: config.BUS_PREFIX ?? "", logger });
  const revocations = subscribe(bus, subjects.events.credentialRevoked, (event) => cache.invalidate(String(event.data.id)), logger);
  // A renamed or deleted group's old slug must not keep answering from a cached principal.
  const renames = subscribe(bus, subjects.events.groupRenamed, (event) => access.forgetGroup(parseGroupRenamed(event.data).previous_slug), logger);
  const deletions = subscribe(bus, subjects.events.groupDeleted, (event) => parseGroupDeleted(event.data).slugs.forEach((slug) => access.forgetGroup(slug)), logger);

  await app.ready();
  return {
    app,
    cache,
    async close() {
      await app.close();
      await access.close();
      revocations.unsubscribe();
      renames.unsubscribe();
      deletions.unsubscribe();
      await bus?.close();
    },
  };
}
