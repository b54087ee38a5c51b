// The TypeScript receipt helper: the same receipts as capabilities/packkit.py builds, for a
// pack whose server is written for node. A tool returns receipt(status, {...}).
//
//   return receipt("succeeded", {effects: [effect("note:1", "write", "verified")],
//                                values: [value("length", 12, "character", "workspace")]});

export const RECEIPT_SCHEMA = 1;

export type Status =
  | "succeeded" | "partial" | "failed" | "unknown" | "waiting" | "running"
  | "queued" | "cancelled" | "rejected";
export type Verification = "verified" | "service_ack" | "not_verified" | "unknown";
export type Retry = "allowed" | "forbidden" | "after_check";

export interface Effect { target: string; action: string; verification: Verification }
export interface Value { name: string; value: unknown; unit: string | null; source: string }

export interface ReceiptOptions {
  summary?: string;
  effects?: Effect[];
  values?: Value[];
  content?: Record<string, unknown>;
  unknowns?: string[];
  retry?: Retry;
  check_with?: string;
  waiting_on?: "owner" | "service" | null;
  error?: [code: string, message: string];
  task_id?: string;
  revision?: number;
}

export function receipt(status: Status, opts: ReceiptOptions = {}): Record<string, unknown> {
  const body: Record<string, unknown> = { receipt_schema: RECEIPT_SCHEMA, status };
  if (opts.summary !== undefined) body.summary = opts.summary;
  if (opts.effects && opts.effects.length) body.effects = opts.effects;
  if (opts.values && opts.values.length) body.values = opts.values;
  if (opts.content !== undefined) body.content = opts.content;
  if (opts.unknowns && opts.unknowns.length) body.unknowns = opts.unknowns;
  const next: Record<string, string> = {};
  if (opts.retry !== undefined) next.retry = opts.retry;
  if (opts.check_with !== undefined) next.check_with = opts.check_with;
  if (opts.waiting_on !== undefined) next.waiting_on = opts.waiting_on;
  if (Object.keys(next).length) body.next = next;
  if (opts.error !== undefined) body.error = { code: opts.error[0], message: opts.error[1] };
  if (opts.task_id !== undefined) body.task_id = opts.task_id;
  if (opts.revision !== undefined) body.revision = opts.revision;
  return body;
}

export function effect(target: string, action: string, verification: Verification): Effect {
  return { target, action, verification };
}

export function value(name: string, val: unknown, unit: string | null, source: string): Value {
  return { name, value: val, unit, source };
}
