"""SCIM provisioning (issue 45): the resources an identity provider writes through /scim/v2 (users
and groups, with the groups' members). Going down drops them."""
from peewee import *


def up(migrator, db):
    class ScimUser(Model):
        user_id = CharField(primary_key=True, max_length=32)
        user_name_key = CharField(max_length=255, unique=True)
        doc = TextField()
        created_at = DateTimeField()
        updated_at = DateTimeField()

        class Meta:
            database = db
            table_name = 'scim_user'

    class ScimGroup(Model):
        id = CharField(primary_key=True, max_length=32)
        display_name = CharField(max_length=255, index=True)
        doc = TextField()
        created_at = DateTimeField()
        updated_at = DateTimeField()

        class Meta:
            database = db
            table_name = 'scim_group'

    class ScimGroupMember(Model):
        group_id = CharField(max_length=32)
        member_id = CharField(max_length=32, index=True)
        kind = CharField(max_length=8)

        class Meta:
            database = db
            table_name = 'scim_group_member'
            primary_key = CompositeKey('group_id', 'member_id')

    db.create_tables([ScimUser, ScimGroup, ScimGroupMember])


def down(migrator, db):
    for table in ('scim_group_member', 'scim_group', 'scim_user'):
        db.execute_sql(f'DROP TABLE {table}')
