"""The operator process: kopf handlers (`handlers`), configuration (`settings`), orchestration (`reconciler`)."""
