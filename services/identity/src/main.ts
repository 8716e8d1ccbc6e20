import "@platform/service/heap";
import { identityEnv, loadConfigOrExit } from "@platform/config";
import { runMain } from "@platform/service";
import { build } from "./app.ts";

const config = loadConfigOrExit(identityEnv);
runMain("identity", () => build(config));
