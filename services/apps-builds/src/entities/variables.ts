import { defineEntity, p } from "@mikro-orm/core";
import { AuditEntrySchema } from "@platform/db";

/** One environment variable of one app branch (doc 2 section 2.6); effective at the next deploy. */
export const VariableSchema = defineEntity({
  name: "Variable",
  tableName: "variables",
  properties: {
    appId: p.uuid().primary(),
    key: p.text().primary(),
    value: p.text(),
    updatedAt: p.datetime(),
  },
});
export class Variable extends VariableSchema.class {}
VariableSchema.setClass(Variable);

/**
 * The per-branch variables document: `updated_at` and `updated_by` describe the whole document,
 * not one variable. Every write that changes a branch's variables moves `updatedAt` forward by
 * at least a millisecond, so it identifies one state of the document (the copy guard).
 */
export const VariableSetSchema = defineEntity({
  name: "VariableSet",
  tableName: "variable_sets",
  properties: {
    appId: p.uuid().primary(),
    updatedAt: p.datetime(),
    updatedBy: p.text(),
  },
});
export class VariableSet extends VariableSetSchema.class {}
VariableSetSchema.setClass(VariableSet);

export const variableEntities = [VariableSchema, VariableSetSchema, AuditEntrySchema];
