import "@platform/service/heap";
import { appsBuildsEnv, loadConfigOrExit } from "@platform/config";
import { runMain } from "@platform/service";
import { build } from "./app.ts";

const config = loadConfigOrExit(appsBuildsEnv);
runMain("apps-builds", () => build(config));
