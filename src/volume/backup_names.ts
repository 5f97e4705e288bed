/**
 * The names of the snapshots the plugin takes for backups (src/replicate/local.ts takes them):
 * the volume domain knows them too, as they are the plugin's own and never stand in the way of
 * deleting a volume (subtree.ts).
 */

/** Prefix of the snapshots the plugin takes for backups. */
export const BACKUP_PREFIX = ".backup-";

/**
 * A backup snapshot's name after "@": `.backup-<unix seconds>-<sequence>` (this version: the
 * sequence number its manifest gets, see src/store/chain.ts), or `.backup-<unix seconds>`
 * (taken by earlier versions, still the plugin's).
 */
const BACKUP_COMPONENT = /^\.backup-\d{1,12}(?:-(\d{1,15}))?$/;

/** Whether a snapshot name (after "@") is one the plugin takes for backups, of any version. */
export function isBackupComponent(component: string): boolean {
  return BACKUP_COMPONENT.test(component);
}

/** The sequence number in a backup snapshot's name, or undefined (another name, or an old one). */
export function backupSequenceOf(component: string): number | undefined {
  const n = BACKUP_COMPONENT.exec(component)?.[1];
  return n === undefined ? undefined : Number(n);
}
